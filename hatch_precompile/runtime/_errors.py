"""The loader's public exceptions and warning (re-exported by `__init__`)."""


class PrecompiledModelError(RuntimeError):
    """No shipped artifact can run here and the fallback policy is "error"."""


class PrecompiledIntegrityError(PrecompiledModelError):
    """A shipped file is not what the build wrote (tampered, truncated, missing)."""


class PrecompiledFallbackWarning(UserWarning):
    """A model runs eagerly because no shipped artifact fits this process."""
