"""Package list for setuptools (everything else is in pyproject.toml).

``configs/`` stays at the top of the repository (docs and tpu_scripts use it) and ships inside the
wheel as the package ``jaxsample.configs`` (its folders as data subpackages, their YAML files
as package data); the code finds it with :func:`jaxsample.config.shipped_configs`.
"""

from setuptools import find_namespace_packages, find_packages, setup

CONFIGS = ["jaxsample.configs"] + [f"jaxsample.configs.{p}" for p in find_namespace_packages(where="configs")]

setup(
    packages=find_packages(include=["jaxsample", "jaxsample.*", "wakong", "wakong.*"]) + CONFIGS,
    package_dir={"jaxsample.configs": "configs"},
    package_data={name: ["*.yaml"] for name in CONFIGS},
)
