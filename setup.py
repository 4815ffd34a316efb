"""The one C extension (fastdata/_native.c, see fastdata/native.py); everything else is in
pyproject.toml. Optional: where it does not compile, the install goes on and fastdata uses
torch ops instead."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("fastdata._native", ["fastdata/_native.c"], optional=True)])
