"""Package layout: one import package, ``roll_async``; everything else is in pyproject.toml.

The repository keeps ``pipelines/`` and ``env_managers/`` at its root (the project's card names them there);
they install as ``roll_async.pipelines`` and ``roll_async.env_managers``, never as top-level packages.
"""

from setuptools import find_packages, setup

MAPPED_FOLDERS = {
    "roll_async.pipelines": "pipelines",
    "roll_async.env_managers": "env_managers",
}

packages = find_packages(include=["roll_async", "roll_async.*"])
for package, folder in MAPPED_FOLDERS.items():
    packages += [package] + [f"{package}.{sub}" for sub in find_packages(folder)]

setup(packages=packages, package_dir=MAPPED_FOLDERS)
