"""Workspaces: the shell an agent works in for one episode (a Docker container or a local sandbox).

``interface`` holds the contract every runtime implements; the env that drives an agent in a shell
(``roll_async.envs.swe``) knows only that contract, so the same tests run against each runtime.
"""
