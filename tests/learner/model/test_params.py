"""The parameter tables describe every parameter the model has."""

from __future__ import annotations

import pytest

import learner.sharding as sharding
from learner.model import io as model_io
from learner.model import qwen2
from learner.model.params import PARTITION_RULES


def test_rules_cover_every_parameter_of_both_variants() -> None:
    for tied in (True, False):
        cfg = qwen2.Qwen2Config.from_hf({**qwen2.PRESETS["tiny"], "tie_word_embeddings": tied})
        sharding.check_rules_cover(model_io.flat_params(qwen2.abstract(cfg)), PARTITION_RULES)
    with pytest.raises(KeyError, match="no partition rule"):
        sharding.match_rule("layers.0.attn.q_norm.scale_new", PARTITION_RULES)
