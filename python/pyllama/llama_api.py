"""The llama.h-style API: names and argument order as llama-cpp-python's low-level
``llama_cpp`` module exposes llama.h, so code written for it ports by changing the import.
Pointer arguments take numpy arrays. Failures return None / integer codes and log why
through the ``pyllama`` logger, as llama.h does.

Each area lives in its own module; this one gathers them.
"""

from ._api_context import *  # noqa: F401,F403
from ._api_model import *  # noqa: F401,F403
from ._api_sampling import *  # noqa: F401,F403
from ._api_state import *  # noqa: F401,F403
from ._api_vocab import *  # noqa: F401,F403
from ._api_system import *  # noqa: F401,F403
from ._api_system import NOT_SUPPORTED  # noqa: F401  (llama.h functions that raise NotImplementedError)
from ._api_batch_ext import *  # noqa: F401,F403
from ._api_adapter import *  # noqa: F401,F403
