"""Contextual embeddings: pooling against hand computation and Hugging Face,
windowing, standardisation / anisotropy, 1-NN WSD, readers, the CLI and its plot."""

import os
import struct
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import api
from bertjax.data import tokenizer as tokenizer_lib
from bertjax.embeddings import analysis, extract, wsd
from bertjax.errors import ConfigError, DataError
from bertjax.model.bert import FAMILY, ModelConfig

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
CORPUS = ["the river bank was muddy after the rain .",
          "she deposited the money at the bank on monday .",
          "unbelievably , the plants grew everywhere in the greenhouse ."] * 10
TEXTS = ["the river bank was muddy .", "unbelievably the riverbanks grew plants",
         "money"]


@pytest.fixture(scope="module")
def tiny():
  """A random 4-layer BERT (H=32) with a WordPiece vocabulary trained on CORPUS."""
  tok = tokenizer_lib.train_tokenizer(CORPUS, "wordpiece", vocab_size=120)
  config = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, num_layers=4,
                       num_heads=2, intermediate_size=64, max_position_embeddings=64,
                       dropout_rate=0.0, attention_dropout_rate=0.0)
  model = FAMILY.pretraining(config)
  params = jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"]
  return api.Pretrained(config, params, tok, model)


@pytest.fixture(scope="module")
def tiny_embedder(tiny):
  """Mean of the last four layers; batch 3 rounds up to the device count (sharded)."""
  return extract.Embedder(tiny, "mean4", batch_size=3)


@pytest.fixture(scope="module")
def tiny_hidden(tiny):
  return tiny.encode(TEXTS)["hidden_states"]  # [5, B, T, 32]


def test_layer_choices_match_hand_computation(tiny_hidden):
  hs = tiny_hidden
  hand = {"last": hs[4], "mean4": (hs[1] + hs[2] + hs[3] + hs[4]) / 4,
          "sum4": hs[1] + hs[2] + hs[3] + hs[4], 2: hs[2], -1: hs[4], "-5": hs[0],
          "concat4": np.concatenate([hs[1], hs[2], hs[3], hs[4]], -1)}
  for layers, expected in hand.items():
    chosen = extract.parse_layers(layers, 4)
    np.testing.assert_allclose(extract.combine_layers(hs, chosen), expected, atol=1e-6)
    np.testing.assert_allclose(extract.combine_layers(jnp.asarray(hs), chosen), expected,
                               atol=1e-6)
  for bad in ("max4", 5, "-6"):
    with pytest.raises(ConfigError, match="layers="):
      extract.parse_layers(bad, 4)


def test_token_word_sentence_pooling_match_hand_computation(tiny, tiny_embedder,
                                                            tiny_hidden):
  hs = tiny_hidden[1:].mean(0)  # mean4 of a 4-layer model: all four blocks
  embedder, tok = tiny_embedder, tiny.tokenizer
  assert embedder.batch_size == len(jax.local_devices())
  lengths = [len(tok.tokenize(t)) for t in TEXTS]
  for b, (vectors, tokens) in enumerate(embedder.tokens(TEXTS)):
    assert tokens == [tok.id_to_token(i) for i in tok.tokenize(TEXTS[b])]
    np.testing.assert_allclose(vectors, hs[b, 1:1 + lengths[b]], atol=1e-5)
  assert any(len(tok.tokenize(w)) > 1 for t in TEXTS for w in t.split())  # mean != first
  for pool in ("first", "mean"):
    for b, (vectors, words, spans) in enumerate(embedder.words(TEXTS, pool=pool)):
      assert words == TEXTS[b].split()
      assert [TEXTS[b][s:e] for s, e in spans] == words
      sizes = [len(tok.tokenize(w)) for w in words]
      assert sum(sizes) == lengths[b]  # the words' subwords tile the text's
      starts = 1 + np.cumsum([0] + sizes[:-1])
      for w, (s, k) in enumerate(zip(starts, sizes)):
        hand = hs[b, s] if pool == "first" else hs[b, s:s + k].mean(0)
        np.testing.assert_allclose(vectors[w], hand, atol=1e-5)
  np.testing.assert_allclose(embedder.sentences(TEXTS, "cls"), hs[:, 0], atol=1e-5)
  np.testing.assert_allclose(embedder.sentences(TEXTS, "mean"),
                             [hs[b, 1:1 + n].mean(0) for b, n in enumerate(lengths)],
                             atol=1e-5)


def test_spans_become_words():
  text = "the bank's door"
  assert extract.segments(text) == [(0, 3), (4, 10), (11, 15)]
  assert extract.segments(text, [(4, 8)]) == [(0, 3), (4, 8), (8, 10), (11, 15)]
  assert extract.find_word("Bank, then the bank.", "bank", 1) == (15, 19)
  with pytest.raises(DataError, match="overlap"):
    extract.segments(text, [(0, 5), (4, 8)])
  with pytest.raises(DataError, match="occurs 0 time"):
    extract.find_word(text, "river")


def test_long_inputs_are_windowed_not_truncated(tiny):
  assert extract.windows(20, 6, 2) == [(0, 6), (4, 10), (8, 14), (12, 18), (14, 20)]
  np.testing.assert_array_equal(extract.best_window(10, [(0, 6), (4, 10)]),
                                [0, 0, 0, 0, 0, 1, 1, 1, 1, 1])
  text = " ".join(CORPUS[:3])
  ids = tiny.tokenizer.tokenize(text)
  embedder = extract.Embedder(tiny, "last", max_length=8, overlap=2)
  vectors, tokens = embedder.tokens([text])[0]
  assert len(tokens) == len(ids) > 6 and vectors.shape == (len(ids), 32)
  spans = extract.windows(len(ids), 6, 2)
  owner = extract.best_window(len(ids), spans)
  for w, (s, e) in enumerate(spans):
    row = np.array([tiny.tokenizer.build_inputs(ids[s:e])[0]], np.int32)
    hs = tiny.model.apply({"params": tiny.params}, row, np.ones_like(row),
                          method="encode")["hidden_states"][-1][0]
    j = np.flatnonzero(owner == w)
    np.testing.assert_allclose(vectors[j], np.asarray(hs)[1 + j - s], atol=1e-5)
  with pytest.raises(ConfigError, match="max_length=3"):
    extract.Embedder(tiny, max_length=3)
  with pytest.raises(ConfigError, match="needs 4 layers"):
    extract.parse_layers("mean4", 2)


def test_word_vectors_match_transformers(minilm, minilm_hf):
  torch = pytest.importorskip("torch")
  texts = ["The river bank was muddy after unbelievably heavy rain.",
           "She deposited cash at the bank, naïvely."]
  hf_tok, model = minilm_hf
  words = [t.split() for t in texts]
  batch = hf_tok(words, is_split_into_words=True, padding=True, return_tensors="pt")
  with torch.no_grad():
    hs = np.stack([h.numpy() for h in model(**batch, output_hidden_states=True)
                   .hidden_states])
  theirs = hs[-4:].mean(0)  # the last four of MiniLM's six layers
  embedder = extract.Embedder(minilm, "mean4")
  for pool in ("first", "mean"):
    for b, (vectors, ours_words, _) in enumerate(embedder.words(texts, pool=pool)):
      assert ours_words == words[b]
      word_ids = np.array([-1 if w is None else w for w in batch.word_ids(b)])
      for w in range(len(words[b])):
        pieces = theirs[b, word_ids == w]
        hand = pieces[0] if pool == "first" else pieces.mean(0)
        np.testing.assert_allclose(vectors[w], hand, atol=1e-4, rtol=1e-4)


def test_standardisation_and_anisotropy(tmp_path):
  rng = np.random.default_rng(0)
  iso = rng.normal(size=(4000, 64))
  assert abs(analysis.anisotropy(iso)) < 0.01
  rogue = iso * np.linspace(0.5, 2, 64) + 3.0
  rogue[:, 7] += 40.0  # one dimension with a huge mean dominates every cosine
  assert analysis.anisotropy(rogue) > 0.5
  dims = analysis.rogue_dimensions(rogue, top=64)
  assert dims[0][0] == 7 and dims[0][2] > 0.5
  np.testing.assert_allclose(sum(c for _, c, _ in dims), analysis.anisotropy(rogue),
                             rtol=1e-6)
  standardizer = analysis.Standardizer.fit(rogue)
  standardizer.save(str(tmp_path / "stats.npz"))
  loaded = analysis.Standardizer.load(str(tmp_path / "stats.npz"))
  z = loaded(rogue)
  np.testing.assert_allclose(z.mean(0), 0, atol=1e-5)
  np.testing.assert_allclose(z.std(0), 1, atol=1e-5)
  report = analysis.report(rogue, loaded)
  assert abs(report["anisotropy_standardized"]) < 0.01 < report["anisotropy_raw"]
  with pytest.raises(DataError, match="same model and layers"):
    loaded(iso[:, :10])


def test_sense_inventory_recovers_constructed_senses():
  """Two lemmas, senses as well-separated clusters; most training data in one sense."""
  rng = np.random.default_rng(1)
  centres = {(lemma, s): rng.normal(size=16) * 5 for lemma in "ab" for s in range(3)}
  def draw(counts):
    examples, vectors = [], []
    for (lemma, s), n in counts.items():
      for _ in range(n):
        examples.append(wsd.Example("x", (0, 1), lemma, f"{lemma}{s}"))
        vectors.append(centres[lemma, s] + rng.normal(size=16))
    return examples, np.stack(vectors)
  train, train_vectors = draw({k: 8 if k[1] == 0 else 2 for k in centres})
  test, test_vectors = draw({k: 5 for k in centres})
  inventory = wsd.SenseInventory.build(train, train_vectors)
  assert inventory.senses["a"] == ["a0", "a1", "a2"]
  predicted = [inventory.nearest(x.lemma, v) for x, v in zip(test, test_vectors)]
  assert predicted == [x.sense for x in test]
  assert [inventory.most_frequent(x.lemma) for x in test].count("a0") == 15
  assert inventory.nearest("unseen", test_vectors[0]) is None


def test_readers():
  train = wsd.read_jsonl(os.path.join(FIXTURES, "wsd_train.jsonl"))
  assert len(train) == 24 and {x.lemma for x in train} == {"bank", "bass", "plant"}
  assert all(x.sentence[x.span[0]:x.span[1]].lower() == x.lemma for x in train)
  xml = wsd.read_examples(os.path.join(FIXTURES, "wsd_semcor.xml"))
  assert [(x.sentence[x.span[0]:x.span[1]], x.lemma, x.sense) for x in xml[:3]] == [
      ("bank", "bank", "bank%1:14:00::"), ("raised", "raise", "raise%2:30:00::"),
      ("interest rates", "interest_rate", "interest_rate%1:21:00::")]
  assert xml[4].sentence == "We sat on the bank of the river ." and xml[4].span == (14, 18)


@pytest.mark.parametrize("line,match", [
    ("not json", "is not JSON"),
    ('{"sentence": "a b", "word": "a"}', "lacks the field"),
    ('{"sentence": "a b", "sense": "s", "index": 5}', "has 2 words"),
    ('{"sentence": "a b", "sense": "s", "word": "a", "index": 0}', "exactly one")])
def test_jsonl_errors(tmp_path, line, match):
  path = tmp_path / "bad.jsonl"
  path.write_text(line + "\n")
  with pytest.raises(DataError, match=match):
    wsd.read_jsonl(str(path))


@pytest.mark.slow
def test_wsd_on_minilm(minilm):
  embedder = extract.Embedder(minilm, "last")
  train = wsd.read_jsonl(os.path.join(FIXTURES, "wsd_train.jsonl"))
  # One example per sense, tested on themselves: every answer is known exactly.
  single = list({(x.lemma, x.sense): x for x in train}.values())
  assert wsd.evaluate(embedder, single, single)["accuracy"] == 1.0
  test = wsd.read_jsonl(os.path.join(FIXTURES, "wsd_test.jsonl"))
  result = wsd.evaluate(embedder, train, test)
  assert result["coverage"] == 1.0 and result["mfs_accuracy"] == 0.5
  assert result["accuracy"] > result["mfs_accuracy"]


def _cli(*args):
  env = dict(os.environ, JAX_NUM_CPU_DEVICES="2")
  proc = subprocess.run([sys.executable, "-m", "bertjax.embed", *args], env=env,
                        capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  return proc.stdout


@pytest.mark.slow
def test_cli_extract_and_plot(tmp_path, minilm_dir):
  texts = tmp_path / "texts.txt"
  texts.write_text("The bank raised rates.\n\nWe sat on the bank .\n")
  out = tmp_path / "words.npz"
  printed = _cli(f"--checkpoint={minilm_dir}", f"--input={texts}", f"--out={out}",
                 "--layers=concat4")
  assert "10 word vectors of size 1536 from 2 texts" in printed
  with np.load(out) as f:
    assert f["vectors"].shape == (10, 1536)
    assert list(f["items"][:2]) == ["The", "bank"] and list(f["text_index"]) == [0] * 4 + [1] * 6
  png = tmp_path / "bank.png"
  printed = _cli("plot", f"--checkpoint={minilm_dir}", "--word=bank",
                 f"--input={os.path.join(FIXTURES, 'wsd_train.jsonl')}", f"--out={png}",
                 "--size=640x480")
  assert "8 occurrences of 'bank', 2 senses" in printed
  data = png.read_bytes()
  assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
  assert struct.unpack(">II", data[16:24]) == (640, 480)
