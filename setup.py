"""Package discovery, which pyproject.toml cannot express: the repository's top folders partition/, kernels/ and
benchmarks/ install inside gnn_dist (gnn_dist.partition, ...), so a subpackage added anywhere, under gnn_dist/
or under one of them, is found and shipped without a line to add here (tests/test_packaging.py checks it).
Everything else about the distribution is in pyproject.toml."""
from setuptools import find_packages, setup

MAPPED_FOLDERS = ("partition", "kernels", "benchmarks")

packages = find_packages(include=["gnn_dist", "gnn_dist.*"])
package_dir = {"gnn_dist": "gnn_dist"}
for folder in MAPPED_FOLDERS:
    packages += ["gnn_dist." + found for found in find_packages(include=[folder, folder + ".*"])]
    package_dir["gnn_dist." + folder] = folder

setup(packages=packages, package_dir=package_dir)
