"""A TFDS builder that turns a local corpus into an ArrayRecord TFDS dataset.

  python -m bertjax.data.tfds_builder --input='/data/*.txt' --data_dir=/data/tfds \
      --name=my_corpus

then train with `--config.data.corpus=tfds:my_corpus/default` (and TFDS_DATA_DIR=/data/tfds).
Each example is one document: `{'text': its sentences joined by newlines}`, read by
`sources.iter_documents` (any local spec: text, JSON lines, .gz, globs, directories).
No TensorFlow is needed: the ArrayRecord format is written with `array_record`.
"""

from __future__ import annotations

import dataclasses

from absl import flags
import tensorflow_datasets as tfds

from bertjax.console import cli
from bertjax.data import sources


@dataclasses.dataclass
class LocalCorpusConfig(tfds.core.BuilderConfig):
  """`input`: a local corpus spec; `text_field`: the JSON-lines text key."""
  input: str = ""
  text_field: str = "text"


class LocalCorpus(tfds.core.GeneratorBasedBuilder):
  """One `train` split of documents from a local corpus."""

  VERSION = tfds.core.Version("1.0.0")

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self, features=tfds.features.FeaturesDict({"text": tfds.features.Text()}),
        description=f"Local corpus {self.builder_config.input!r}, one document each.")

  def _split_generators(self, dl_manager):
    del dl_manager
    return {"train": self._generate_examples()}

  def _generate_examples(self):
    cfg = self.builder_config
    for i, doc in enumerate(sources.iter_documents(cfg.input, cfg.text_field)):
      yield i, {"text": "\n".join(doc)}


def build(input_spec: str, data_dir: str, name: str = "local_corpus",
          text_field: str = "text") -> str:
  """Prepares `input_spec` as TFDS dataset `name` under `data_dir` (ArrayRecord);
  returns the spec to train on (`tfds:NAME`)."""
  builder_cls = type(name.title().replace("_", ""), (LocalCorpus,),
                     {"name": name, "__module__": __name__})
  config = LocalCorpusConfig(name="default", version=LocalCorpus.VERSION,
                             input=input_spec, text_field=text_field)
  builder = builder_cls(config=config,
                        data_dir=data_dir, file_format="array_record")
  builder.download_and_prepare()
  return f"{sources.TFDS_PREFIX}{name}/default"


def main(argv):
  del argv
  print(build(flags.FLAGS.input, flags.FLAGS.data_dir, flags.FLAGS.name, flags.FLAGS.text_field))


if __name__ == "__main__":
  # Defined only when run as a program, so importing the module defines no flags.
  flags.DEFINE_string("input", None, "Corpus file, glob or directory.")
  flags.DEFINE_string("data_dir", None, "TFDS data directory to write into.")
  flags.DEFINE_string("name", "local_corpus", "Dataset name (snake_case).")
  flags.DEFINE_string("text_field", "text", "JSON-lines text key.")
  flags.mark_flags_as_required(["input", "data_dir"])
  cli.run(main)
