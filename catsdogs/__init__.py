"""catsdogs: which batch size should I train with, and what does it cost?

From Python (catsdogs.api): `catsdogs.find_batch_size(model, data)` returns a `BatchSizeAdvice`;
`catsdogs.profile`, `catsdogs.sweep` and `catsdogs.report` do what their commands do; every
error a user can fix is a `catsdogs.CatsdogsError`. In a model's own `fit`:
`catsdogs.keras.GradientNoiseScale`. Imported on first use, so `import catsdogs` (and every worker
process) stays light.
"""

from catsdogs.version import __version__

_API = ("BatchSizeAdvice", "CatsdogsError", "SettingError", "close", "find_batch_size", "profile", "report", "sweep")
__all__ = [*_API, "__version__"]


def __getattr__(name: str):
    if name in _API:
        from catsdogs import api

        return getattr(api, name)
    raise AttributeError(f"module 'catsdogs' has no attribute {name!r}")
