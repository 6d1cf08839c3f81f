"""Tokenizers with their own special tokens (EuroBERT's Llama-3 BPE): bertjax's
'template' style reads a tokenizer.json's post-processor template and the folder's
tokenizer_config.json, and gives transformers' AutoTokenizer's ids for single texts and
pairs (token types, truncation and padding included); saved for transformers (the
family table's TOKENIZER_JSON) AutoTokenizer reads the same ids; masking uses its
<|mask|>, padding its <|end_of_text|>; a tiny EuroBERT trains with it and exports.

The folder is built here, as Llama-3's is (its pre-tokenizer's regex, byte-level BPE,
`<|begin_of_text|> $A <|end_of_text|>` in a Sequence beside ByteLevel), over a small BPE
trained on CORPUS, with Llama-3's special tokens after the vocabulary in Llama-3's order
(<|mask|> where EuroBERT put it: bos + 2), and no unk."""

import json
import os

import numpy as np
import pytest
import tokenizers
from tokenizers import Regex, decoders, models, pre_tokenizers, processors, trainers

from bertjax.data import tokenizer as tok_lib
from bertjax.errors import DataError
from tests.test_tokenizer import CORPUS, PAIRS, SAMPLES

transformers = pytest.importorskip("transformers")

# Llama-3's pre-tokenizer regex (its tokenizer.json's Split).
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Llama-3's special tokens from id 128000 (EuroBERT's: <|mask|> at 128002), here from
# the end of the BPE's vocabulary.
SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>", "<|mask|>",
            "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>")
BOS, EOS, MASK = SPECIALS[:3]
# Pair templates: eos between the texts, or each text in bos ... eos.
PAIR_TEMPLATES = {"eos_between": f"{BOS} $A {EOS} $B:1 {EOS}:1",
                  "each_wrapped": f"{BOS} $A {EOS} {BOS}:1 $B:1 {EOS}:1"}
TEXTS = SAMPLES + [f"the capital of France is {MASK}.", f"x{MASK}y {BOS} z"]


def llama3_library(pair: str | None = PAIR_TEMPLATES["eos_between"],
                   single: str = f"{BOS} $A {EOS}") -> tokenizers.Tokenizer:
  """A Llama-3-style `tokenizers.Tokenizer` (trained on CORPUS: ~300 ids, specials last)."""
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
      pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
      vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
      show_progress=False))
  tok.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False)
                          for t in SPECIALS])
  ids = [(t, tok.token_to_id(t)) for t in (BOS, EOS)]
  tok.post_processor = processors.Sequence([
      processors.ByteLevel(trim_offsets=False),
      processors.TemplateProcessing(single=single, special_tokens=ids,
                                    **({"pair": pair} if pair else {}))])
  return tok


def write_folder(directory, tok: tokenizers.Tokenizer, **config) -> str:
  """tokenizer.json + EuroBERT's tokenizer_config.json (pad = eos, <|mask|>, no unk)."""
  os.makedirs(directory, exist_ok=True)
  tok.save(os.path.join(directory, "tokenizer.json"))
  config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS,
            "pad_token": EOS, "mask_token": MASK, "model_max_length": 8192, **config}
  with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
    json.dump(config, f)
  return str(directory)


@pytest.fixture(scope="module", params=list(PAIR_TEMPLATES))
def folder(request, tmp_path_factory):
  return write_folder(tmp_path_factory.mktemp(request.param),
                      llama3_library(PAIR_TEMPLATES[request.param]))


def _theirs(hf, texts, pairs=None, max_length=512):
  enc = hf(texts, pairs, truncation=True, max_length=max_length, padding="longest",
           return_token_type_ids=True, return_attention_mask=True)
  return {k: np.asarray(v) for k, v in enc.items()}


def assert_same_inputs(ours, hf):
  """bertjax's and AutoTokenizer's ids, token types and attention masks, for single texts
  and pairs at lengths that cut them (longest first) and that do not."""
  for text in TEXTS:
    assert ours.tokenize(text) == hf(text, add_special_tokens=False)["input_ids"], text
  a, b = (list(x) for x in zip(*PAIRS))
  cases = [(TEXTS, None, 512), (TEXTS, None, 5)] + [(a, b, n) for n in (8, 11, 64)]
  for texts, pairs, max_length in cases:
    mine, theirs = ours(texts, pairs, max_length=max_length), _theirs(hf, texts, pairs, max_length)
    for k in ("input_ids", "token_type_ids", "attention_mask"):
      np.testing.assert_array_equal(mine[k], theirs[k], err_msg=f"{k} {max_length}")


def test_llama3_folder_matches_transformers(folder):
  """The folder's special tokens (Llama-3's names and ids after the BPE's), and
  bertjax's inputs equal AutoTokenizer's, printed for a single text and a pair."""
  hf = transformers.AutoTokenizer.from_pretrained(folder)
  ours = tok_lib.load_tokenizer(folder)
  n = ours.vocab_size - len(SPECIALS)
  assert ours.style == "template" and ours.vocab_size == len(hf)
  assert [ours.id_to_token(n + k) for k in range(len(SPECIALS))] == list(SPECIALS)
  assert (ours.cls_id, ours.sep_id, ours.pad_id, ours.mask_id, ours.unk_id) == (
      n, n + 1, n + 1, n + 2, None)
  assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id, hf.mask_token_id,
          hf.unk_token_id) == (n, n + 1, n + 1, n + 2, None)
  assert ours.special_ids == frozenset(range(n, n + len(SPECIALS)))
  assert ours.mask_token == MASK and ours.num_special(False) == 2
  assert ours.num_special(True) == (4 if "each_wrapped" in folder else 3)
  assert_same_inputs(ours, hf)
  single, pair = ours("the cat sat"), ours("the cat sat", "on the mat")
  print(f"\n{os.path.basename(folder)} single: bertjax {single['input_ids'][0].tolist()} "
        f"transformers {hf('the cat sat')['input_ids']}")
  print(f"pair: bertjax {pair['input_ids'][0].tolist()} types "
        f"{pair['token_type_ids'][0].tolist()}; transformers "
        f"{hf('the cat sat', 'on the mat')['input_ids']} types "
        f"{hf('the cat sat', 'on the mat', return_token_type_ids=True)['token_type_ids']}")
  ids = ours.tokenize("the quick brown fox")
  assert ours.decode(ours.build_inputs(ids)[0]) == "the quick brown fox"
  starts = ours.word_starts()
  assert starts[ours.tokenize(" fox")[0]] and starts[ours.mask_id]


def test_saved_for_transformers_and_back(folder, tmp_path):
  """`Tokenizer.save` (the workdir's, prepared data's copy) loads back the same;
  `save_hf_tokenizer` with the EuroBERT table's TOKENIZER_JSON (and without) gives
  AutoTokenizer the same ids and special tokens; the folder transformers saves from it,
  the bare tokenizer.json and `from_library` load back the same."""
  from bertjax.hf import convert, files  # pylint: disable=g-import-not-at-top
  ours = tok_lib.load_tokenizer(folder)
  key = lambda t: (t.style, t.vocab_size, t.layout)
  ours.save(str(tmp_path / "saved"))
  back = tok_lib.load_tokenizer(str(tmp_path / "saved"))
  assert key(back) == key(ours) and back.tokenize_batch(TEXTS) == ours.tokenize_batch(TEXTS)
  assert key(tok_lib.load_tokenizer(os.path.join(folder, "tokenizer.json"))) == key(ours)
  assert key(tok_lib.from_library(ours.library)) == key(ours)  # pad = eos, <|mask|>: defaults
  table = convert.family_table("eurobert")
  for tokenizer_json in (table.TOKENIZER_JSON, not table.TOKENIZER_JSON):
    out = str(tmp_path / f"hf_{tokenizer_json}")
    assert files.save_hf_tokenizer(out, ours, 64, tokenizer_json) == "json"
    hf = transformers.AutoTokenizer.from_pretrained(out)
    assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id, hf.mask_token_id) == (
        ours.cls_id, ours.sep_id, ours.pad_id, ours.mask_id)
    assert hf.model_max_length == 64
    assert_same_inputs(ours, hf)
    hf.save_pretrained(str(tmp_path / f"again_{tokenizer_json}"))
    assert key(tok_lib.load_tokenizer(str(tmp_path / f"again_{tokenizer_json}"))) == key(ours)


def test_masking_and_packing_use_its_tokens(folder):
  """EuroBERT's recipe masks with <|mask|> (every chosen token), never a special token;
  packed rows (documents isolated) are <|begin_of_text|> ... <|end_of_text|> padded with
  <|end_of_text|> (its pad); random replacements never draw a special token."""
  from bertjax.data import builders, masking  # pylint: disable=g-import-not-at-top
  from configs import eurobert_tiny  # pylint: disable=g-import-not-at-top
  tok = tok_lib.load_tokenizer(folder)
  docs = [[tok.tokenize(s) for s in tok_lib.running_text(CORPUS[k:k + 2])] for k in (0, 2, 4)]
  examples = builders.create_packed_examples(docs, tok, max_seq_length=48, packing="stream",
                                             isolate_documents=True)
  ids = examples.input_ids
  assert (ids[:, 0] == tok.cls_id).all()
  for row, n in zip(ids, examples.lengths):
    assert row[n - 1] == tok.sep_id and (row[n:] == tok.pad_id).all()
  assert (examples.lengths < 48).any()  # some padding
  data = eurobert_tiny.get_config().data
  data.max_predictions_per_seq = 16
  cfg = masking.MaskingConfig.create(data, tok)
  assert cfg.mask_id == tok.mask_id and not set(cfg.random_ids.tolist()) & tok.special_ids
  out = masking.mask_tokens(ids, np.random.default_rng(0), cfg)
  rows = np.arange(len(ids))[:, None]
  real = out["masked_lm_weights"] > 0
  chosen = out["input_ids"][rows, out["masked_lm_positions"]][real]
  assert real.any() and (chosen == tok.mask_id).all()
  assert not np.isin(out["masked_lm_ids"][real], list(tok.special_ids)).any()
  unchanged = np.ones(ids.shape, bool)
  unchanged[np.broadcast_to(rows, real.shape)[real], out["masked_lm_positions"][real]] = False
  np.testing.assert_array_equal(out["input_ids"][unchanged], ids[unchanged])


def test_vocabulary_extension_reads_a_tokenizer_without_unk(folder):
  """Adding words to a tokenizer without unk (Llama-3's): what it has is what its
  vocabulary holds (a lookup answers None for the rest, never unk's id)."""
  from bertjax.data import vocab_extension  # pylint: disable=g-import-not-at-top
  tok = tok_lib.load_tokenizer(folder)
  assert tok.unk_id is None
  assert vocab_extension._has(tok, "<|mask|>")  # pylint: disable=protected-access
  assert not vocab_extension._has(tok, "surely-not-a-token")  # pylint: disable=protected-access


def _state(tok: tokenizers.Tokenizer) -> dict:
  return json.loads(tok.to_str())


def _from_state(state: dict, config: dict | None = None):
  return tok_lib.from_library(tokenizers.Tokenizer.from_str(json.dumps(state)), config)


def test_layouts_it_cannot_follow_are_refused_in_one_line():
  """Llama-3's own template (bos only: no row-ending token), none at all, no mask token,
  a config naming a token the vocabulary lacks: one line each. A template without a
  pair (the library's `$A $B`) reads single texts and refuses pairs."""
  base = _state(llama3_library())
  template = base["post_processor"]["processors"][1]
  cases = []
  llama3 = json.loads(json.dumps(base))
  llama3["post_processor"]["processors"][1]["single"] = template["single"][:2]
  cases.append((llama3, {}, "bos \\$A eos"))
  cases.append((dict(base, post_processor=None), {}, "neither \\[CLS\\]"))
  no_mask = json.loads(json.dumps(base))
  no_mask["added_tokens"] = [t for t in base["added_tokens"] if t["content"] != MASK]
  cases.append((no_mask, {}, "no mask token"))
  cases.append((base, {"pad_token": "<|pad|>"}, "pad_token '<\\|pad\\|>' is not in"))
  for state, config, match in cases:
    with pytest.raises(DataError, match=match) as e:
      _from_state(state, config)
    assert "\n" not in str(e.value)
  single_only = _from_state(_state(llama3_library(pair=None)), {"pad_token": EOS})
  assert single_only.build_inputs([7, 8])[0] == [single_only.cls_id, 7, 8, single_only.sep_id]
  with pytest.raises(DataError, match="pair template") as e:
    single_only(["a"], ["b"])
  assert "\n" not in str(e.value)


@pytest.mark.slow
def test_tiny_eurobert_trains_and_exports_with_it(tmp_path):
  """A tiny EuroBERT pretrains on the embedded corpus with the Llama-3 folder (30% of
  the tokens masked with <|mask|>, rows padded with <|end_of_text|>); exported
  (`python -m bertjax.convert --to=hf`), AutoTokenizer gives bertjax's ids and
  EuroBertForMaskedLM its logits."""
  from bertjax import api, convert  # pylint: disable=g-import-not-at-top
  from bertjax.train import pretrain  # pylint: disable=g-import-not-at-top
  from configs import eurobert_tiny  # pylint: disable=g-import-not-at-top
  from tests import faults  # pylint: disable=g-import-not-at-top
  from tests.helpers import hf_outputs, load_hf, tiny_config  # pylint: disable=g-import-not-at-top
  folder = write_folder(tmp_path / "tok", llama3_library())
  tok = tok_lib.load_tokenizer(folder)
  c = eurobert_tiny.get_config()
  c.train = tiny_config(num_steps=8, log_every=4, eval_every=8, checkpoint_every=8,
                        eval_batches=1).train
  c.data.max_seq_length, c.data.max_predictions_per_seq = 32, 10
  c.data.tokenizer.path, c.data.tokenizer.vocab_size = folder, tok.vocab_size
  m = c.model
  m.vocab_size, m.hidden_size, m.num_layers, m.num_heads, m.num_kv_heads = (
      tok.vocab_size, 32, 2, 2, 1)
  m.intermediate_size, m.max_position_embeddings, m.dtype = 48, 64, "float32"
  m.pad_token_id = tok.pad_id
  workdir = str(tmp_path / "run")
  pretrain.run(c, workdir)
  assert sorted(faults.losses(workdir)) == [4, 8]
  exported = str(tmp_path / "hf")
  convert.main(["--to=hf", f"--src={workdir}", f"--dst={exported}"])
  texts = ["the cat sat on the mat", f"the capital of France is {MASK}.", "a"]
  pretrained = api.load_pretrained(workdir)
  assert pretrained.tokenizer.style == "template"
  ours = pretrained.logits(texts)
  hf = transformers.AutoTokenizer.from_pretrained(exported)
  enc = hf(texts, padding=True)
  np.testing.assert_array_equal(enc["input_ids"], ours["input_ids"])
  assert (ours["input_ids"][ours["attention_mask"] == 0] == tok.pad_id).all()
  with open(os.path.join(exported, "config.json")) as f:
    hf_config = json.load(f)
  assert (hf_config["bos_token_id"], hf_config["eos_token_id"], hf_config["pad_token_id"],
          hf_config["mask_token_id"]) == (tok.cls_id, tok.sep_id, tok.pad_id, tok.mask_id)
  model = load_hf(exported)
  assert type(model).__name__ == "EuroBertForMaskedLM"
  ref = hf_outputs(model, ours["input_ids"], ours["attention_mask"]).logits.numpy()
  real = ours["attention_mask"].astype(bool)
  assert np.abs(ours["mlm_logits"] - ref)[real].max() < 1e-4
