"""The jobs behind ``python -m jaxsample``: :mod:`~jaxsample.jobs.demo`, :mod:`~jaxsample.jobs.showcase`,
:mod:`~jaxsample.jobs.train` (evaluation lives in :mod:`jaxsample.evaluation`). Each has a config kind
(``demo``, ``showcase``, ``train``), a ``load(path, overrides)`` and a ``run(config, ...)``."""
