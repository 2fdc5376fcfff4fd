"""The teacher: verified Triton translations of functional-format programs, without an LLM.

`translate(source)` turns a problem into a candidate module defining
`triton_fused_operator`; `prompt.build_prompt` / `prompt.extract_code` define the
prompt and answer format shared by SFT data and RL; `build` verifies translations
through the sandbox and writes the SFT pairs.
"""

from .parse import TranslationError
from .translate import Translation, translate

__all__ = ["Translation", "TranslationError", "translate"]
