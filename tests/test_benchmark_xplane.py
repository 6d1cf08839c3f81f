"""bertjax/benchmarks/xplane.py: a GPU trace's kernels back to the program's
instructions and their model scopes (a hand-encoded trace: no GPU needed); and
config.train.prng_impl, the lever it measures."""

import jax
import pytest

from bertjax.benchmarks import xplane


def _varint(n: int) -> bytes:
  out = b""
  while True:
    byte, n = n & 0x7F, n >> 7
    out += bytes([byte | (0x80 if n else 0)])
    if not n:
      return out


def _field(number: int, value) -> bytes:
  if isinstance(value, int):
    return _varint(number << 3) + _varint(value)
  value = value.encode() if isinstance(value, str) else value
  return _varint(number << 3 | 2) + _varint(len(value)) + value


def _instruction(iid, name, opcode, op_name="", called=(), target=""):
  body = (_field(1, name) + _field(2, opcode) + _field(35, iid)
          + _field(3, _field(2, 16) + _field(3, 8))  # bf16[8]
          + _field(7, _field(2, op_name)))
  body += b"".join(_field(38, c) for c in called)
  return body + (_field(28, target) if target else b"")


def _trace_bytes() -> bytes:
  """An XSpace whose /host:metadata plane stores a program: two fusions sharing one
  kernel (a layer's erfc, twice), a dropout RNG fusion, a cuBLAS call between them."""
  rng = "jit(train_step)/jvp(M)/encoder/layer_0/Dropout_0/jit(_bernoulli)/jit(_uniform)/xor"
  gelu = "jit(train_step)/jvp(M)/encoder/layer_{}/erfc"
  fused = lambda cid, op: _field(1, f"fused{cid}") + _field(5, cid) + _field(
      2, _instruction(100 + cid, f"x{cid}", "erfc" if "erfc" in op else "xor", op))
  entry = [(1, "loop_xor_fusion", "fusion", rng, (11,), ""),
           (2, "custom-call.1", "custom-call",
            "jit(train_step)/jvp(M)/encoder/layer_0/intermediate/dot_general", (), 
            "__cublas$lt$matmul"),
           (3, "loop_erfc_fusion", "fusion", gelu.format(0), (12,), ""),
           (4, "loop_erfc_fusion.1", "fusion", gelu.format(1), (13,), "")]
  computations = [fused(11, rng), fused(12, gelu.format(0)), fused(13, gelu.format(1)),
                  _field(1, "main") + _field(5, 1) + b"".join(
                      _field(2, _instruction(*e)) for e in entry)]
  schedule = _field(1, _field(1, 1) + _field(2, b"".join(_field(1, i) for i in
                                                         (1, 2, 3, 4))))
  module = (_field(1, "jit_train_step") + _field(2, "main")
            + b"".join(_field(3, c) for c in computations) + _field(7, schedule))
  stat = _field(1, 9) + _field(6, _field(1, module))  # 'Hlo Proto' bytes
  plane = (_field(2, "/host:metadata")
           + _field(5, _field(1, 9) + _field(2, _field(1, 9) + _field(2, "Hlo Proto")))
           + _field(4, _field(1, 1) + _field(2, _field(1, 1) + _field(2, "m")
                                              + _field(5, stat))))
  return _field(1, plane)


def test_kernels_align_with_the_schedule_and_name_their_sources():
  (program,) = xplane.programs(_trace_bytes()).values()
  assert [i["name"] for i in program.schedule] == [
      "loop_xor_fusion", "custom-call.1", "loop_erfc_fusion", "loop_erfc_fusion.1"]
  step = [("loop_xor_fusion", 0, 5), ("Memset 0", 6, 1), ("nvjet_sm90_tst", 8, 20),
          ("void cublasLt::splitKreduce_kernel", 29, 2),
          ("loop_erfc_fusion", 32, 4), ("loop_erfc_fusion", 37, 4)]  # a shared kernel
  events = step + [(n, s + 100, d) for n, s, d in step]
  placed = xplane.assign(events, program)
  assert [(e[0], i["name"], s) for e, i, s in placed[:6]] == [
      ("loop_xor_fusion", "loop_xor_fusion", 0), ("Memset 0", "custom-call.1", 0),
      ("nvjet_sm90_tst", "custom-call.1", 0),
      ("void cublasLt::splitKreduce_kernel", "custom-call.1", 0),
      ("loop_erfc_fusion", "loop_erfc_fusion", 0),
      ("loop_erfc_fusion", "loop_erfc_fusion.1", 0)]
  assert {s for _, _, s in placed[6:]} == {1}
  labels = [xplane.source(program, program.by_name[n])[0] for n in (
      "loop_xor_fusion", "custom-call.1", "loop_erfc_fusion.1")]
  assert labels == ["dropout masks drawn (threefry)", "matmuls",
                    "GELU forward (erf) + bias"]
  with pytest.raises(Exception, match="disagree"):
    xplane.assign([("loop_erfc_fusion", 0, 1)], program)


def test_prng_impl_draws_the_step_key_from_that_implementation():
  from bertjax.errors import ConfigError
  from bertjax.train import step as step_lib
  seen = {}
  for impl in ("", "unsafe_rbg"):
    def objective_sums(params, batch, rng, impl=impl):
      seen[impl] = jax.random.key_impl(rng)
      return {"loss": (params["w"] * batch["x"]).sum()}
    objective = step_lib.Objective(
        init=None, sums=objective_sums, counts=lambda b: {"n": 1.0},
        loss=lambda s, c: s["loss"], metrics=lambda s, c: {}, metric_names=())
    import optax  # pylint: disable=g-import-not-at-top
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    tx = optax.sgd(0.1)
    params = {"w": jnp.ones(3)}
    state = step_lib.TrainState(jnp.zeros((), jnp.int32), params, tx.init(params),
                                step_lib.new_window(objective))
    train_step = step_lib.make_train_step(objective, tx, lambda s: 0.1, prng_impl=impl)
    jax.eval_shape(train_step, state, {"x": jnp.ones(3)}, jnp.int32(0))
  assert "threefry" in str(seen[""]) and "rbg" in str(seen["unsafe_rbg"])
  from bertjax.errors import one_of  # The field's check (build_trainer's).
  with pytest.raises(ConfigError):
    one_of("train.prng_impl", "philox", step_lib.PRNG_IMPLS)
