"""The shipped YAML configs (``<kind>/<name>.yaml``), installed as the package ``jaxsample.configs``.

Find them with :func:`jaxsample.config.shipped_configs`, not with paths relative to the repository.
"""
