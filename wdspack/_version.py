"""The one version string: the package face, the manifests, the resume fingerprints and
``pyproject.toml`` (``[tool.setuptools.dynamic]``) all read it from here."""

__version__ = "0.1.0"
