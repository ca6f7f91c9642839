"""One exception family, so callers (and the CLI) can catch our errors apart from bugs.

Every message names the problem and the fix; the CLI prints it as one line.
"""


class HaikuRAGError(Exception):
    """Base class for every error haiku.rag raises on purpose."""


class ConfigError(HaikuRAGError):
    """The configuration file or a setting is invalid."""


class SourceError(HaikuRAGError):
    """A source spec could not be resolved or loaded (missing path, failed fetch...)."""


class StoreError(HaikuRAGError):
    """The store is missing, incompatible with the settings, or refuses the operation."""


class StoreNotFoundError(StoreError):
    """No store exists at the given path and `create` was not asked for."""


class EmbeddingError(HaikuRAGError):
    """The embedding model could not be loaded or failed after retries."""


class ReadOnlyError(StoreError):
    """A write was attempted on a store opened read-only or a read-only driver."""


class ExtractionError(HaikuRAGError):
    """The graph extractor model could not be reached or refused the requests."""
