"""catsdogs's version: recorded with every trial (host.versions) and read by the package's build."""

__version__ = "0.46.0"
