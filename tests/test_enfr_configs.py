"""The English->French configs of Table 2 resolve, validate and build (no data needed)."""

import pytest

from transformer_jax.runtime.config import ModelConfig, validate
from transformer_jax.runtime.overrides import load
from transformer_jax.tools.params import count_params


@pytest.mark.parametrize("name, dropout, keep, millions", [
    ("configs/base_enfr.py", 0.1, 5, 60.5),
    ("configs/big_enfr.py", 0.1, 20, 209.1),
])
def test_enfr_configs_resolve_and_build(name, dropout, keep, millions):
  c = validate(load(name, []))
  assert c.data.dataset == "wmt14_translate/fr-en"
  assert (c.data.source_lang, c.data.target_lang) == ("en", "fr")
  assert c.model.vocab_size == 32000
  assert c.model.dropout_rate == dropout          # big EN-FR: 0.1, not big's 0.3 (§6.1)
  assert c.train.keep_checkpoints == keep         # averaged: last 5 (base), last 20 (big)
  assert count_params(ModelConfig.from_config(c.model)) / 1e6 == pytest.approx(millions, rel=2e-3)


def test_parsing_config_is_the_papers_section_6_3():
  c = validate(load("configs/wsj_parsing.py", []))
  m, dc = c.model, c.decode
  assert (m.num_encoder_layers, m.num_decoder_layers, m.d_model, m.vocab_size) == (4, 4, 1024, 16000)
  assert (dc.beam_size, dc.alpha, dc.max_extra_len) == (21, 0.3, 300)
  assert (c.data.train_files, c.data.eval_files, c.data.test_files) == (
      "wsj_0200-wsj_2199", "wsj_2200-wsj_2299", "wsj_2300-wsj_2399")
