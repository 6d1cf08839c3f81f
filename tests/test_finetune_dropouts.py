"""Fine-tuning defaults equal Hugging Face's for every family (`hf.convert.hf_dropouts`,
`tasks.finetune.load_start`): a bertjax-pretrained checkpoint, saved with its
pretraining's dropouts, fine-tunes with the dropouts the same weights exported to
transformers fine-tune with (BERT, ModernBERT, ELECTRA, DeBERTa; ModernBERT's
training-only `attention_output_dropout` 0.1 becomes 0)."""

import dataclasses

import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from bertjax.checkpoint import pretrained as pretrained_lib  # pylint: disable=wrong-import-position
from bertjax.hf import convert
from bertjax.tasks import finetune
from configs.finetune import glue
from tests.deberta_helpers import hf_deberta
from tests.electra_helpers import hf_electra
from tests.helpers import perturb
from tests.modernbert_helpers import hf_modernbert
from tests.tasks_helpers import fixture_tokenizer

# family -> (its pretraining recipe's dropouts, as configs/*_base.py set them; the
# transformers config fields and the bertjax fields they are).
FAMILIES = {
    "bert": (dict(dropout_rate=0.1, attention_dropout_rate=0.1),
             {"hidden_dropout_prob": "dropout_rate",
              "attention_probs_dropout_prob": "attention_dropout_rate"}),
    "modernbert": (dict(attention_output_dropout=0.1, attention_dropout=0.0,
                        embedding_dropout=0.0, mlp_dropout=0.0),
                   {"attention_dropout": "attention_dropout",
                    "embedding_dropout": "embedding_dropout", "mlp_dropout": "mlp_dropout",
                    "classifier_dropout": "classifier_dropout"}),
    "electra": (dict(dropout_rate=0.1, attention_dropout_rate=0.1),
                {"hidden_dropout_prob": "dropout_rate",
                 "attention_probs_dropout_prob": "attention_dropout_rate"}),
    "deberta": (dict(dropout_rate=0.1, attention_dropout_rate=0.1),
                {"hidden_dropout_prob": "dropout_rate",
                 "attention_probs_dropout_prob": "attention_dropout_rate",
                 "pooler_dropout": "pooler_dropout", "cls_dropout": "cls_dropout"}),
}


def _hf_dir(family: str, directory: str) -> str:
  if family == "modernbert":
    return hf_modernbert(directory)
  if family == "electra":  # a discriminator, its pretraining dropouts off
    return hf_electra(directory, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  if family == "deberta":
    return hf_deberta(directory, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  tok = fixture_tokenizer(directory)
  config = transformers.BertConfig(vocab_size=400, hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, intermediate_size=64,
                                   max_position_embeddings=64, hidden_dropout_prob=0.0,
                                   attention_probs_dropout_prob=0.0)
  torch.manual_seed(0)
  perturb(transformers.BertForMaskedLM(config)).save_pretrained(directory)
  return tok


def dropouts(model) -> dict[str, float]:
  return {k: v for k, v in dataclasses.asdict(model).items() if "dropout" in k}


def _finetuned_model(init_from: str):
  c = glue.get_config("sst2")
  c.init_from = init_from
  c.model.dtype = "float32"
  return finetune.load_start(c).model


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_bertjax_pretrained_model_finetunes_with_hugging_faces_dropouts(family, tmp_path,
                                                                          caplog):
  pretraining, hf_fields = FAMILIES[family]
  hf = pretrained_lib.load_pretrained(_hf_dir(family, str(tmp_path / "hf")))
  config = dataclasses.replace(hf.config, **pretraining)
  workdir, exported = str(tmp_path / "workdir"), str(tmp_path / "exported")
  pretrained_lib.save_workdir(workdir, hf.params, config, hf.tokenizer)
  saved = pretrained_lib.load_pretrained(workdir).config
  assert dropouts(saved) == dropouts(config) != dropouts(hf.config)  # as pretrained
  convert.save_hf(exported, hf.params, config, hf.tokenizer)
  theirs = transformers.AutoConfig.from_pretrained(exported)
  caplog.set_level("INFO")
  ours = _finetuned_model(workdir)
  for hf_name, name in hf_fields.items():  # what transformers fine-tunes the export with
    assert getattr(ours, name) == getattr(theirs, hf_name), name
  assert dropouts(ours) == dropouts(_finetuned_model(exported))
  if family == "modernbert":  # training-only: transformers has no such dropout
    assert ours.attention_output_dropout == 0.0
    assert "attention_output_dropout 0.1 -> 0.0" in caplog.text
