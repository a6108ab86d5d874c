"""Package layout: one import package, ``roll_async``; everything else is in pyproject.toml.

The repository keeps ``pipelines/`` and ``env_managers/`` at its root (the project's card names them there);
they install as ``roll_async.pipelines`` and ``roll_async.env_managers``, never as top-level packages.
"""

from setuptools import find_namespace_packages, find_packages, setup

MAPPED_FOLDERS = {
    "roll_async.pipelines": "pipelines",
    "roll_async.env_managers": "env_managers",
}

# Namespace discovery, so data folders (envs/data) count as packages and their files ship.
packages = find_namespace_packages(
    include=["roll_async", "roll_async.*"], exclude=["*.__pycache__"]
)
for package, folder in MAPPED_FOLDERS.items():
    packages += [package] + [f"{package}.{sub}" for sub in find_packages(folder)]

setup(packages=packages, package_dir=MAPPED_FOLDERS)
