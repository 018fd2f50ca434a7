"""Sharding: the same training on DP, FSDP, TP and mixed meshes as on one device, and bad meshes.

The sharded checks need 8 devices, which on CPU means XLA_FLAGS=--xla_force_host_platform_
device_count=8 before jax starts. So this file is also a script: the module-scoped fixture runs
`python -m tests.test_sharding` in a subprocess with that flag (nothing leaks into the pytest
process or other test files), the script trains two steps on each mesh and prints a JSON report,
and the tests below check it. Config mistakes (mesh sizes, divisibility) and the sharding rules
are checked in-process, in test_mesh_rules.py.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.common import xla_flags

pytestmark = pytest.mark.xdist_group(__name__)  # one worker builds the fixture: see conftest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUM_DEVICES = 8
MESHES = {"data8": (8, 1, 1), "fsdp8": (1, 8, 1), "tensor8": (1, 1, 8), "mixed222": (2, 2, 2)}
# Parameter path -> expected PartitionSpec of the parameter and of its Adam moments.
EXPECTED_SPECS = {
    "shared_embedding.embedding": ("tensor", "fsdp"),
    "encoder.layer_0.self_attention.query": ("fsdp", "tensor", None),
    "encoder.layer_0.self_attention.out": ("tensor", None, "fsdp"),
    "decoder.layer_0.cross_attention.key": ("fsdp", "tensor", None),
    "encoder.layer_0.ffn.wi.kernel": ("fsdp", "tensor"),
    "encoder.layer_0.ffn.wi.bias": ("tensor",),
    "decoder.layer_0.ffn.wo.kernel": ("tensor", "fsdp"),
    "decoder.layer_0.ffn_block.norm.scale": ("fsdp",),
}


# ----------------------------------------------------------------------------- the 8-device worker


def tiny_mesh_config(mesh_shape=(1, 1, 1), dtype="float32"):
  from configs import tiny  # pylint: disable=g-import-not-at-top
  c = tiny.get_config()
  m = c.model
  m.vocab_size, m.d_model, m.num_heads, m.d_k, m.d_v, m.d_ff = 64, 32, 8, 8, 8, 64
  m.num_encoder_layers = m.num_decoder_layers = 1
  m.dtype = dtype
  # Updates of ~6e-3 per step: large enough that a wrong gradient shows, small enough that Adam's
  # normalisation (m / sqrt(v) of near-zero gradients) does not blow float reassociation noise
  # up beyond the 1e-5 the parameters are compared to.
  c.train.warmup_steps, c.train.learning_rate_scale = 2, 0.1
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = mesh_shape
  return c


def _batches(num=2, rows=8, src_len=12, tgt_len=10, vocab=64):
  rng = np.random.default_rng(0)
  out = []
  for _ in range(num):
    inputs = rng.integers(3, vocab, (rows, src_len)).astype(np.int32)
    targets = rng.integers(3, vocab, (rows, tgt_len)).astype(np.int32)
    inputs[::3, -4:] = 0  # some padding
    targets[1::3, -3:] = 0
    out.append({"inputs": inputs, "targets": targets})
  return out


def _path(keypath) -> str:
  return ".".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in keypath)


def flat(tree) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  return {_path(k): v for k, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _adam_mu(opt_state) -> dict:
  """Adam's first moments by parameter path, wherever optax keeps them in the state."""
  import jax  # pylint: disable=g-import-not-at-top
  out = {}
  for keypath, leaf in jax.tree_util.tree_flatten_with_path(opt_state)[0]:
    names = [getattr(k, "name", None) for k in keypath]
    if "mu" in names:
      out[_path(keypath[names.index("mu") + 1:])] = leaf
  return out


def _spec(sharding) -> list:
  """A PartitionSpec as a JSON list without trailing Nones."""
  spec = [a if a is None or isinstance(a, str) else list(a) for a in sharding.spec]
  while spec and spec[-1] is None:
    spec.pop()
  return spec


def _train_two_steps(shape, devices, initial_state=None, dtype="float32"):
  """Two train steps (and one eval) on a mesh: from `create_state` (the state initialised
  directly sharded) or, to save an init compilation, from `initial_state` placed on the mesh."""
  import jax  # pylint: disable=g-import-not-at-top
  from transformer_jax.model import sharding  # pylint: disable=g-import-not-at-top
  from transformer_jax.training import step as step_lib
  config = tiny_mesh_config(shape, dtype)
  mesh = sharding.make_mesh(config.mesh, devices)
  sharding.check_divisibility(config, mesh)
  _, state_sh = step_lib.state_shardings(config, mesh)
  if initial_state is None:
    state = step_lib.create_state(config, mesh, state_sh)
  else:
    state = jax.device_put(initial_state, state_sh)
  initial = jax.tree.map(np.asarray, state)
  train_fn = step_lib.jit_train_step(config, mesh, state_sh)
  losses, grad_norms, compiled = [], [], None
  for batch in _batches():
    gbatch = sharding.global_batch(mesh, batch)
    if compiled is None:
      with sharding.mesh_context(mesh):
        compiled = train_fn.jitted.lower(state, gbatch).compile()
      batch_rows = gbatch["inputs"].addressable_shards[0].data.shape[0]
    state, metrics = compiled(state, gbatch)  # the executable inspected below runs the steps
    losses.append(float(metrics["loss_sum"]))
    grad_norms.append(float(metrics["grad_norm"]))
  eval_fn = step_lib.jit_eval_step(config, mesh, state_sh.params)
  eval_nll = float(eval_fn(state.params, sharding.global_batch(mesh, _batches()[0]))["nll_sum"])
  return mesh, state, compiled, (losses, grad_norms), eval_nll, batch_rows, initial


def _report_mesh(name, shape, devices, reference):
  import jax  # pylint: disable=g-import-not-at-top
  # The mixed mesh creates its state sharded (and must match the one-device initialisation).
  start = None if name == "mixed222" else reference["initial_state"]
  mesh, state, compiled, (losses, grad_norms), eval_nll, batch_rows, initial = _train_two_steps(
      shape, devices, start)
  init_diff = max(float(np.max(np.abs(a - b))) for a, b in zip(
      jax.tree.leaves(initial.params), jax.tree.leaves(reference["initial_state"].params)))
  params = flat(state.params)
  ref_params = reference["params"]
  max_diff = max(float(np.max(np.abs(np.asarray(params[k]) - ref_params[k]))) for k in params)
  in_state_sh = flat(compiled.input_shardings[0][0].params)
  mu = _adam_mu(state.opt_state)
  leaves = {}
  for key in EXPECTED_SPECS:
    p = params[key]
    leaves[key] = {
        "spec": _spec(p.sharding),
        "compiled_spec": _spec(in_state_sh[key]),
        "mu_spec": _spec(mu[key].sharding),
        "shape": list(p.shape),
        "shard_shape": list(p.addressable_shards[0].data.shape),
        "mu_shard_shape": list(mu[key].addressable_shards[0].data.shape),
    }
  dev0 = jax.devices()[0]
  state_leaves = jax.tree.leaves(state.params) + jax.tree.leaves(state.opt_state)
  total = sum(x.size * x.dtype.itemsize for x in state_leaves)
  on_dev0 = sum(s.data.size * s.data.dtype.itemsize for x in state_leaves
                for s in x.addressable_shards if s.device == dev0)
  return {"mesh": dict(mesh.shape), "losses": losses, "grad_norms": grad_norms,
          "eval_nll": eval_nll, "ref_losses": reference["losses"],
          "ref_grad_norms": reference["grad_norms"], "ref_eval_nll": reference["eval_nll"],
          "max_param_diff": max_diff, "max_init_diff": init_diff, "leaves": leaves,
          "state_bytes": total,
          "state_bytes_device0": on_dev0, "batch_rows_per_device": batch_rows}


def _compiles_during(fn) -> tuple[str, int]:
  """(error message or '', number of XLA compilations) while running fn."""
  import jax  # pylint: disable=g-import-not-at-top
  events = []
  listener = lambda name, *a, **k: events.append(name)  # noqa: E731
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    fn()
    message = ""
  except Exception as e:  # noqa: BLE001 - reported to the test
    message = f"{type(e).__name__}: {e}"
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  return message, sum(1 for e in events if e == "/jax/core/compile/backend_compile_duration")


def _bad_input_report(tmpdir):
  from transformer_jax import train  # pylint: disable=g-import-not-at-top
  from transformer_jax.model import sharding
  out = {}
  cases = {"mesh_product": dict(mesh_shape=(3, 1, 1)),
           "tensor_vs_heads": dict(mesh_shape=(1, 1, 8), heads=4),
           "tensor_vs_d_ff": dict(mesh_shape=(2, 1, 4), d_ff=66)}
  for name, case in cases.items():
    config = tiny_mesh_config(case["mesh_shape"])
    config.model.num_heads = case.get("heads", config.model.num_heads)
    config.model.d_ff = case.get("d_ff", config.model.d_ff)
    out[name] = _compiles_during(
        lambda c=config, n=name: train.train_and_evaluate(c, os.path.join(tmpdir, n)))
  mesh = sharding.make_mesh(tiny_mesh_config((4, 2, 1)).mesh)
  batch = {k: v[:6] for k, v in _batches(1)[0].items()}  # 6 rows on data*fsdp = 8
  out["batch_rows"] = _compiles_during(lambda: sharding.global_batch(mesh, batch))
  return out


def _decode_report(params, devices) -> dict:
  """Beam search with parameters placed by `param_shardings(inference=True)` on the 2x2x2 mesh
  (traced under INFERENCE_RULES) against one device: the same tokens and scores."""
  import functools  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from transformer_jax.decoding import decode  # pylint: disable=g-import-not-at-top
  from transformer_jax.model import sharding
  from transformer_jax.runtime.config import ModelConfig  # pylint: disable=g-import-not-at-top
  config = tiny_mesh_config(MESHES["mixed222"])
  search = functools.partial(decode.beam_decode, ModelConfig.from_config(config.model),
                             beam_size=2, max_extra_len=5)
  inputs = _batches(1)[0]["inputs"]
  ref = jax.jit(search)(jax.device_put(params, devices[0]), inputs)
  mesh = sharding.make_mesh(config.mesh, devices)
  _, params_sh = sharding.param_shardings(config, mesh, inference=True)
  inputs_sh = sharding.logical_sharding(mesh, ("batch", "length"))
  fn = jax.jit(search, in_shardings=(params_sh, inputs_sh))
  with sharding.mesh_context(mesh, sharding.INFERENCE_RULES):
    out = fn(jax.device_put(params, params_sh), inputs)
  # What evaluation runs: decode.translate_batch split over the mesh's data axes.
  best, _ = decode.translate_batch(ModelConfig.from_config(config.model), jax.device_put(params, params_sh),
                                   np.asarray(inputs), beam_size=2, alpha=0.6, max_extra_len=5, mesh=mesh)
  return {"same_tokens": bool(np.array_equal(np.asarray(out[0]), np.asarray(ref[0]))),
          "translate_batch_same": bool(np.array_equal(np.asarray(best), np.asarray(ref[0])[:, 0])),
          "max_score_diff": float(np.max(np.abs(np.asarray(out[1]) - np.asarray(ref[1])))),
          "max_abs_score": float(np.max(np.abs(np.asarray(ref[1])))),
          "wi_spec": _spec(params_sh["encoder"]["layer_0"]["ffn"]["wi"]["kernel"])}


def worker_main(tmpdir: str) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  assert jax.device_count() == NUM_DEVICES, jax.devices()
  devices = jax.devices()
  _, state, _, (losses, grad_norms), eval_nll, _, initial = _train_two_steps((1, 1, 1), devices[:1])
  reference = {"params": {k: np.asarray(v) for k, v in flat(state.params).items()},
               "losses": losses, "grad_norms": grad_norms, "eval_nll": eval_nll,
               "initial_state": initial}
  report = {"meshes": {name: _report_mesh(name, shape, devices, reference)
                       for name, shape in MESHES.items()}}
  report["decode"] = _decode_report(jax.tree.map(np.asarray, state.params), devices)
  # bfloat16 compute (matmul.py's written-out gradients, a layout constraint on the CPU) on the
  # mixed mesh against one device.
  report["bf16"] = {name: _train_two_steps(shape, devices[:math.prod(shape)], dtype="bfloat16")[3]
                    for name, shape in (("one", (1, 1, 1)), ("mixed222", MESHES["mixed222"]))}
  report["bad_inputs"] = _bad_input_report(tmpdir)
  return report


# ----------------------------------------------------------------------------- tests: sharded


def _run_worker(tmp: str) -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=xla_flags(f"--xla_force_host_platform_device_count={NUM_DEVICES}"))
  env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
  proc = subprocess.run([sys.executable, "-m", "tests.test_sharding", tmp], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
  assert "Involuntary full rematerialization" not in proc.stderr, proc.stderr[-5000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def report(tmp_path_factory):
  """The worker's report, computed once per test session (also across pytest-xdist workers)."""
  import fcntl  # pylint: disable=g-import-not-at-top
  base = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    base = base.parent  # shared by this session's xdist workers
  cached = base / "sharding_report.json"
  with open(base / "sharding_report.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not cached.exists():
      cached.write_text(json.dumps(_run_worker(str(tmp_path_factory.mktemp("sharding")))))
  return json.loads(cached.read_text())


@pytest.mark.parametrize("name", list(MESHES))
def test_same_losses_and_params_as_one_device(report, name):
  r = report["meshes"][name]
  assert r["mesh"] == dict(zip(("data", "fsdp", "tensor"), MESHES[name]))
  np.testing.assert_allclose(r["losses"], r["ref_losses"], rtol=1e-5)
  np.testing.assert_allclose(r["grad_norms"], r["ref_grad_norms"], rtol=1e-5)
  assert r["eval_nll"] == pytest.approx(r["ref_eval_nll"], rel=1e-5)
  assert r["max_param_diff"] < 1e-5
  assert r["max_init_diff"] == 0.0  # create_state on 2x2x2 draws the one-device initialisation
  assert r["losses"][1] != r["losses"][0]  # the second step saw updated parameters


def test_bf16_step_on_a_mesh_matches_one_device(report):
  (losses, norms), (ref_losses, ref_norms) = report["bf16"]["mixed222"], report["bf16"]["one"]
  # bfloat16 products round their outputs: a sharded sum rounds at other places than one device.
  np.testing.assert_allclose(losses, ref_losses, rtol=2e-3)
  np.testing.assert_allclose(norms, ref_norms, rtol=5e-3)
  assert losses[1] != losses[0]


@pytest.mark.parametrize("name", list(MESHES))
def test_parameters_and_adam_moments_are_really_sharded(report, name):
  r = report["meshes"][name]
  data, fsdp, tensor = MESHES[name]
  split = {"data": 1, "fsdp": fsdp, "tensor": tensor, None: 1}
  for key, expected in EXPECTED_SPECS.items():
    leaf = r["leaves"][key]
    stripped = list(expected[:max((i + 1 for i, a in enumerate(expected) if a), default=0)])
    assert leaf["spec"] == stripped, (key, leaf)           # the state as created
    assert leaf["compiled_spec"] == stripped, (key, leaf)  # what the compiled step takes
    assert leaf["mu_spec"] == stripped, (key, leaf)        # Adam's moments follow the params
    want = [n // split[a] for n, a in zip(leaf["shape"], expected)]
    assert leaf["shard_shape"] == want, (key, leaf)
    assert leaf["mu_shard_shape"] == want, (key, leaf)
  # Each device holds its share of parameters + Adam moments: all of it for pure DP, about
  # 1/(fsdp*tensor) otherwise (a few small vectors, e.g. LayerNorm under TP, stay whole).
  share = r["state_bytes_device0"] / r["state_bytes"]
  ideal = 1 / (fsdp * tensor)
  assert ideal <= share < ideal + 0.1, (share, ideal)
  assert r["batch_rows_per_device"] == 8 // (data * fsdp)


def test_beam_search_with_inference_shardings_matches_one_device(report):
  r = report["decode"]
  assert r["wi_spec"] == [None, "tensor"]  # weights whole along d_model, split over tensor
  assert r["same_tokens"] and r["translate_batch_same"]
  # Sums of log-probabilities from differently partitioned programs: relative tolerance.
  assert r["max_score_diff"] <= 1e-5 * max(1.0, r["max_abs_score"])


@pytest.mark.parametrize("case", [
    "mesh_product", "tensor_vs_heads", "tensor_vs_d_ff", "batch_rows"])
def test_bad_inputs_fail_with_config_error_before_compiling(report, case):
  message, compiles = report["bad_inputs"][case]
  assert message.startswith("ConfigError: "), message
  assert "\n" not in message
  assert compiles == 0, message
  expected = {"mesh_product": "multiply to 3, but there are 8 devices",
              "tensor_vs_heads": "'model.num_heads'=4 is not divisible by the tensor-parallel size",
              "tensor_vs_d_ff": "'model.d_ff'=66 is not divisible by the tensor-parallel size",
              "batch_rows": "6 rows, not divisible by the data-parallel size mesh.data*mesh.fsdp=8"}
  assert expected[case] in message


if __name__ == "__main__":
  print(json.dumps(worker_main(sys.argv[1])))
