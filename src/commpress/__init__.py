"""commpress: cheaper communication for distributed PyTorch training."""

from commpress.codecs import Codec, get_codec, list_codecs

__version__ = "0.1.0"

__all__ = ["Codec", "__version__", "get_codec", "list_codecs"]
