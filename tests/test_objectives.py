"""Objectives and evaluators by name (`bertjax.objectives`, `bertjax.train.evaluators`):
the booleans of configs and workdirs written before `config.objectives` map onto the
names (the same model, heads and parameters), a contradiction or an objective the
family cannot serve is one ConfigError line, and `config.evals` replaces
`config.train.eval_final_length` the same way."""

from __future__ import annotations

import json

import jax
import ml_collections
import pytest

from bertjax import objectives as objectives_lib
from bertjax.checkpoint import workdir as workdir_lib
from bertjax.errors import CheckpointError, ConfigError
from bertjax.train import evaluators
from configs import modernbert_tiny
from tests.helpers import tiny_config


def _legacy(config, **booleans) -> dict:
  """`config` as a config.json written before config.objectives and config.evals: the
  model section's booleans name the heads, config.train.eval_final_length the final
  phase's evaluation."""
  old = config.to_dict()
  del old["objectives"], old["evals"]
  old["model"].update(booleans)
  old["train"]["eval_final_length"] = True
  return old


@pytest.mark.parametrize("booleans, names", [
    ({"nsp": True, "sbo": False}, ("mlm", "nsp")),
    ({"nsp": False, "sbo": True}, ("mlm", "sbo")),
    ({"nsp": False}, ("mlm",)),
    ({}, ("mlm", "nsp")),  # The 'bert' model's defaults: MLM and NSP.
    ({"nsp": True, "sbo": True}, ("mlm", "sbo", "nsp")),  # The order the losses added.
])
def test_old_booleans_map_onto_names(booleans, names):
  new = tiny_config()
  new.objectives = names
  old = _legacy(new, **booleans)
  assert objectives_lib.names_of(old) == names
  ours, theirs = objectives_lib.from_config(new), objectives_lib.from_config(old)
  assert ours.model == theirs.model and ours.fields == theirs.fields
  assert (ours.model.nsp, ours.model.sbo) == ("nsp" in names, "sbo" in names)
  shapes = lambda o: jax.tree.map(lambda x: x.shape, jax.eval_shape(
      o.networks.init, jax.random.key(0)))
  assert shapes(ours) == shapes(theirs)
  assert sorted(shapes(ours)) == sorted(("encoder", "mlm") + names[1:])


def test_a_family_without_the_booleans_is_mlm_alone():
  old = modernbert_tiny.get_config().to_dict()
  del old["objectives"]
  assert objectives_lib.names_of(old) == ("mlm",)


@pytest.mark.parametrize("change, message", [
    (dict(objectives=("mlm", "nsp"), nsp=False),
     r"config.model.nsp=False but config.objectives=\('mlm', 'nsp'\) names 'nsp'"),
    (dict(objectives=("mlm", "bogus")), r"no objective 'bogus'; use names of \['mlm', 'nsp', "),
    (dict(objectives=("mlm", "mlm")), r"names an objective twice"),
    (dict(objectives=()), r"give a tuple of objective names"),
    (dict(objectives=("mlm", "nsp"), pooler=False), r"reads the pooled \[CLS\] vector"),
    (dict(objectives=("mlm", "sbo")), r"only span masking draws: set config.data.masking"),
    (dict(objectives=("mlm", "nsp"), isolate_documents=True),
     r"trains on sentence pairs but config.data.isolate_documents=True"),
])
def test_contradictions_are_one_line(change, message):
  config = tiny_config()
  config.objectives = change.pop("objectives")
  for k, v in change.items():
    (config.data if k == "isolate_documents" else config.model)[k] = v
  with pytest.raises(ConfigError, match=message) as e:
    objectives_lib.check(config)
  assert "\n" not in str(e.value)


def test_an_objective_the_family_cannot_serve_is_one_line():
  config = modernbert_tiny.get_config()
  config.objectives = ("mlm", "nsp")
  with pytest.raises(ConfigError, match=r"the 'nsp' objective .* reads the 'nsp' head, "
                     r"which the 'modernbert' family does not have") as e:
    objectives_lib.from_config(config)
  assert "\n" not in str(e.value)


def test_an_old_workdir_resumes_under_the_names(tmp_path):
  """A config.json written with the booleans resumes under the config.objectives they
  name; other objectives are refused (the checkpoint holds other heads)."""
  new = tiny_config()
  new.objectives = ("mlm",)
  (tmp_path / "config.json").write_text(json.dumps(_legacy(new, nsp=False)))
  assert workdir_lib.saved_network(str(tmp_path)).config == objectives_lib.from_config(
      new).model
  assert workdir_lib.check_resume(str(tmp_path), new) == []
  new.objectives = ("mlm", "nsp")
  with pytest.raises(CheckpointError, match=r"holds a run of the objectives \('mlm',\) but "
                     r"config.objectives=\('mlm', 'nsp'\)"):
    workdir_lib.check_resume(str(tmp_path), new)


def test_evals_by_name_and_the_old_field():
  config = tiny_config()
  assert evaluators.evals_of(config) == {"eval": {"type": "held_out", "at_start": False,
                                                  "final_length": False}}
  old = ml_collections.ConfigDict(_legacy(config))
  assert evaluators.evals_of(old) == {"eval": {"type": "held_out", "at_start": False,
                                               "final_length": True}}
  config.evals.mine = {"type": "held_out"}  # Defaults filled in (every type's too).
  assert evaluators.evals_of(config)["mine"] == {"type": "held_out", "at_start": False,
                                                 "final_length": False}
  config.evals.mine.type = "glue"
  with pytest.raises(ConfigError, match=r"config.evals.mine.type='glue': use one of "
                     r"\['held_out'\]"):
    evaluators.evals_of(config)
  config.evals.mine = {"type": "held_out", "batches": 3}
  with pytest.raises(ConfigError, match=r"config.evals.mine has no setting 'batches'"):
    evaluators.evals_of(config)
  del config.evals.mine
  config.train.eval_final_length = True
  with pytest.raises(ConfigError, match=r"config.train.eval_final_length is now a setting"):
    evaluators.evals_of(config)
