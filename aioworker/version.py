"""The package version, in one place (the HTTP server reports it at /version)."""

__version__ = "0.1.0"
