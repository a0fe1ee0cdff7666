"""The device lane: every operation that reads or writes KV cells, through the build's device backend.

On a GPU build (CUDA, ROCm, or Vulkan; in CI, llama.cpp's Vulkan backend on Mesa's llvmpipe) the model's
layers and their cache live in device buffers, llama_decode returns before the device has finished, logits
and saved states are copied back from device memory, and a shift is applied to a device K cache: the paths
the CPU build never takes. Each test asserts what the CPU tests assert: the engine's cache check after every
step, and next-token logits within tolerance of a fresh prefill on the same device. One more compares the
device's logits with the CPU backend's for the same history, and one shows the comparison has teeth: a
conversion that corrupts cells is caught.

On the CPU build the same tests run on the CPU (a cheap check of the tests themselves); with
SWARMTUNE_DEVICE_LANE=1 (the lane's own command, CONTRIBUTING.md) a build that finds no device fails here
instead of passing on the CPU unseen. The model is tests/tiny_gguf.py's `llama_device`: the default model
decodes at 2.7 tok/s on llvmpipe (docs/device.md).
"""

import os

import numpy as np
import pytest

from swarmtune.engine.agents.agent import AgentState
from swarmtune.engine.backends.backend import CacheMismatch
from swarmtune.engine.control import Control
from swarmtune.engine.conversation.chunk_reuse import plan
from swarmtune.engine.engine import Engine, EngineSettings
from swarmtune.engine.errors import UserError
from swarmtune.engine.kv.convert import parse
from swarmtune.engine.kv.types import KVSetting
from swarmtune.engine.measure.kv_probe import probe_kv, probe_kv_converted
from swarmtune.engine.quality.quality_check import QualityCheck
from tests.test_cache_integrity import _kl_nats, assert_each_agent_continues_its_own_text
from tests.tiny_gguf import llama_device

KV = KVSetting.parse
# a cold software device compiles each kernel the first time it runs (llvmpipe: minutes for the first engine
# run and for each new K/V pair, cached by Mesa on disk after): past the suite's 600 s a test on a new machine
pytestmark = [pytest.mark.device, pytest.mark.timeout(1800)]

N_LAYER = 2
CHUNK = 64
SETTINGS = dict(agents=4, ctx_per_agent=512, gen_tokens=16, tool_tokens=48, chunk_tokens=CHUNK, seed=5)
# KL of a rebuilt cache against a fresh prefill on the same device, per setting: what rounding a cache
# rebuilt another way (decode rows against prefill rows; a conversion) may move on this model. Measured on
# llvmpipe and on the CPU at most a fifth of these (docs/device.md); a wrong cell moves it by nats.
TOLERANCE_NATS = {"f16": 0.02, "q8_0": 0.05, "q8_0/f16": 0.05, "f16/q8_0": 0.05}
CODE = "def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(add(i, i * 2))\n" * 6


def _lane() -> bool:
    return os.environ.get("SWARMTUNE_DEVICE_LANE", "0") == "1"


@pytest.fixture(scope="module")
def device_model(tmp_path_factory) -> str:
    return str(llama_device(tmp_path_factory.mktemp("device") / "tiny-device.gguf", n_layer=N_LAYER))


def _backend(path: str, cpu_only: bool = False):
    from swarmtune.engine.backends.llama_backend import LlamaBackend
    from swarmtune.engine.model.model_facts import read_model_facts

    return LlamaBackend(read_model_facts(path), n_threads=1, chunk_tokens=CHUNK, cpu_only=cpu_only)


@pytest.fixture(scope="module")
def dev(device_model):
    b = _backend(device_model)
    if _lane() and b.device is None:
        b.close()
        pytest.fail("the device lane found no device: a Vulkan build needs GGML_VK_VISIBLE_DEVICES=0 to use "
                    "llvmpipe (CONTRIBUTING.md)")
    yield b
    b.close()


@pytest.fixture(scope="module")
def dev_fresh(device_model):
    """A second context on the same device: what an untouched cache computes there."""
    b = _backend(device_model)
    yield b
    b.close()


@pytest.fixture(scope="module")
def cpu(device_model):
    b = _backend(device_model, cpu_only=True)
    yield b
    b.close()


def _check(e: Engine, fresh, most: int = 2) -> int:
    return assert_each_agent_continues_its_own_text(e, fresh, most=most, tolerance=TOLERANCE_NATS)


def _rebuild(e: Engine):
    """The rebuild a KV control asked for: on a device, a step launched before it came (landed or not)
    is handed out first."""
    for _ in range(3):
        if (r := e.step()).kind == "rebuild":
            return r
    raise AssertionError("no rebuild within three steps of the request")


def _prefill(b, seq: int, tokens: list[int], pos0: int = 0) -> None:
    for i in range(0, len(tokens), b.max_chunk_tokens):
        b.steps.prefill(seq, tokens[i : i + b.max_chunk_tokens], pos0 + i)


def _fresh_logits(fresh, kv: KVSetting, tokens: list[int], nxt: int) -> np.ndarray:
    fresh.open(kv, 1, 1024)
    _prefill(fresh, 0, tokens)
    return fresh.steps.next_logits(0, nxt, len(tokens))


def test_the_backend_names_its_device_and_says_when_it_is_emulated(dev):
    d = dev.device
    if d is None:
        assert dev.info.device.startswith("CPU") and dev.info.settings["device"] is None
        pytest.skip("a CPU build: no device to name")
    assert dev.info.device == d.label and dev.info.device.startswith(f"{d.api}: ")
    assert dev.offloaded_layers == N_LAYER + 1  # every layer and the output head
    assert dev.info.settings["device"]["emulated"] == d.emulated
    if "llvmpipe" in d.description:
        assert d.emulated and dev.info.device == "Vulkan: llvmpipe (CPU-emulated)"
    # what the records and the status line carry: `llama.cpp on Vulkan: llvmpipe (CPU-emulated)`
    e = Engine(dev, EngineSettings(**SETTINGS))
    h = e.header()
    assert (h["backend"], h["device"]) == ("llama.cpp", d.label)
    assert h["settings"]["device"]["emulated"] == d.emulated and h["settings"]["offloaded_layers"] == N_LAYER + 1
    from swarmtune.tui.stats import Stats
    from swarmtune.tui.widgets.status import status_text

    stats = Stats()
    stats.header = h
    text = status_text(stats, "", False).plain
    assert f"llama.cpp on {d.label}" in text
    assert ("CPU-emulated device" in text) == d.emulated


def test_every_step_checked_and_each_agent_continues_its_own_text(dev, dev_fresh):
    e = Engine(dev, EngineSettings(**SETTINGS))
    assert e.s.check
    for _ in range(40):
        e.step()
    assert all(a.context for a in e.agents)
    assert _check(e, dev_fresh, most=4) >= 2


def test_overlap_is_on_for_the_device_and_samples_what_a_serial_step_samples(dev, dev_fresh):
    def run(overlap: bool | None) -> tuple[Engine, list[tuple]]:
        # two calls and no reference steps: the measured mixing and the references' cadence rest on timings,
        # which differ from run to run
        e = Engine(dev, EngineSettings(**{**SETTINGS, "overlap": overlap, "mix": False, "reference": False}))
        out = []
        for _ in range(40):
            r = e.step()
            out.append((r.kind, r.batch_ids, [(a.context, a.tail) for a in r.agents]))
        return e, out

    e, launched = run(None)
    if dev.device is not None:  # on a device llama_decode returns once the graph is queued
        assert e.overlap and e.in_flight and e.header()["settings"]["overlap"] is True
    e.overlap = False
    e.step()  # lands it, launches none
    assert not e.in_flight
    assert _check(e, dev_fresh, most=4) >= 2
    assert run(False)[1] == launched


def test_decode_steps_carrying_prefill_chunks_keep_every_cache_on_the_device(dev, dev_fresh):
    e = Engine(dev, EngineSettings(**{**SETTINGS, "mix": True}))
    recs = [e.step() for _ in range(40)]  # the cache check runs after every step
    assert any(r.prefill_tokens for r in recs)
    assert _check(e, dev_fresh, most=4) >= 2


def test_a_kv_switch_by_conversion_k_and_v_apart_keeps_every_cache(dev, dev_fresh):
    e = Engine(dev, EngineSettings(**SETTINGS))
    for _ in range(30):
        e.step()
    for kv in (KV("q8_0/f16"), KV("f16/q8_0"), KV("q8_0"), KV("f16")):
        e.request(Control(kv=kv))
        r = _rebuild(e)
        assert r.kind == "rebuild" and r.kv_type == kv.label and dev.kv == kv
        held = sum(a.context for a in e.agents if a.context)
        assert r.tokens == 0 and r.converted_tokens == held > 0, r.note
        e.land()  # the step launched after the rebuild has written its cells, not yet handed back its tokens
        assert all(dev.cells.span(a.seq) == (0, a.context - 1) for a in e.agents if a.context)
        assert _check(e, dev_fresh) >= 2
        for _ in range(4):
            e.step()
        assert _check(e, dev_fresh) >= 1


def test_a_kv_switch_by_re_prefill_keeps_every_cache(dev, dev_fresh):
    e = Engine(dev, EngineSettings(**SETTINGS, kv_convert=False))
    for _ in range(20):
        e.step()
    e.request(Control(kv=KV("q8_0")))
    r = _rebuild(e)
    assert r.kind == "rebuild" and r.tokens == sum(a.context for a in e.agents)
    assert _check(e, dev_fresh) >= 2


def test_a_corrupted_cell_after_a_conversion_is_caught(dev, dev_fresh, monkeypatch):
    """The check can fail: a conversion that damages the K rows it writes (what a wrong offset or a wrong
    device copy would do) leaves caches of the right length and the wrong content."""
    e = Engine(dev, EngineSettings(**SETTINGS))
    for _ in range(20):
        e.step()
    from swarmtune.engine.backends.llama_cells import LlamaCells

    real = LlamaCells.convert_saved  # each context its own cells: the rebuild's too

    def corrupting(self, handle, kv):
        """Every K and V row lands at another cell (a wrong offset): the positions stay right, the keys and
        values do not, and no longer belong together."""
        out, seconds = real(self, handle, kv)
        data = np.frombuffer(out.data, dtype=np.uint8)
        for i, r in enumerate(parse(data, dev.facts.n_layer).rows):  # every K tensor, then every V tensor
            rows = data[r.data : r.data + r.rows * r.row_bytes].reshape(r.rows, r.row_bytes)
            rows[:] = np.roll(rows, r.rows // 3 if i < dev.facts.n_layer else -(r.rows // 3), axis=0).copy()
        return out, seconds

    monkeypatch.setattr(LlamaCells, "convert_saved", corrupting)
    e.request(Control(kv=KV("q8_0")))
    assert _rebuild(e).converted_tokens > 0
    monkeypatch.undo()
    e.check_caches()  # positions alone cannot see it
    with pytest.raises(AssertionError, match="next-token distribution moved"):
        _check(e, dev_fresh, most=4)


def test_swap_out_and_in_leaves_cells_and_logits_as_they_were(dev):
    dev.open(KV("f16"), 2, 512)
    tokens = dev.text.tokenize(CODE)[:200]
    nxt = tokens[-1]
    _prefill(dev, 0, tokens[:-1])
    before = dev.cells.span(0), dev.steps.next_logits(0, nxt, len(tokens) - 1)
    handle, nbytes, _ = dev.cells.save_seq(0)
    assert nbytes > 0
    dev.cells.drop(0)
    assert dev.cells.span(0) == (-1, -1)
    _prefill(dev, 1, tokens[:100])  # the restored rows land elsewhere in the device buffer
    dev.cells.restore_seq(0, handle)
    assert dev.cells.span(0) == before[0]
    after = dev.steps.next_logits(0, nxt, len(tokens) - 1)
    assert np.argmax(after) == np.argmax(before[1])
    np.testing.assert_allclose(after, before[1], atol=1e-3)


@pytest.mark.parametrize("residency", ["swap", "drop"])
def test_the_engine_swaps_and_drops_waiting_agents_and_each_continues_its_own_text(dev, dev_fresh, residency):
    e = Engine(dev, EngineSettings(**{**SETTINGS, "seed": 3}, tool_latency_s=0.05, tool_latency_sigma=0.5,
                                   residency=residency))
    back = "swap_in" if residency == "swap" else "drop"
    returned: set[int] = set()
    for _ in range(2000):
        r = e.step()
        returned |= {m.agent for m in r.moved if m.op == back}
        ready = [a for a in e.agents if a.id in returned and a.state is AgentState.DECODE and a.next_token is not None]
        if ready and min(a.context for a in ready) > 80:
            break
    else:
        pytest.fail(f"no agent came back from {residency} and decoded")
    assert _check(e, dev_fresh, most=4) >= 1


def _cut_and_paste(b, old: list[int], new: list[int], keep: int, chunks) -> np.ndarray:
    """old prefilled; its cells past `keep` cut, the new tokens prefilled, each kept chunk pasted back shifted
    (llama_memory_seq_add on the K cache): the next-token logits after new[:-1]."""
    b.open(KV("f16"), 1, 1024)
    _prefill(b, 0, old)
    kept = b.cells.cut(0, keep, chunks)
    assert len(kept) == len(chunks)
    pos = keep
    for c, k in zip(chunks, kept, strict=True):
        if c.prompt_at > pos:
            _prefill(b, 0, new[pos : c.prompt_at], pos)
        b.cells.paste(0, k, c.prompt_at)
        pos = c.prompt_at + c.tokens
    if pos < len(new) - 1:
        _prefill(b, 0, new[pos:-1], pos)
    assert b.cells.span(0) == (0, len(new) - 2)
    return b.steps.next_logits(0, new[-1], len(new) - 1)


def test_chunk_cut_paste_and_shift_compute_on_the_device_what_they_compute_on_the_cpu(dev, dev_fresh, cpu):
    """A changed header: the cells after it cut, the new header prefilled, the kept chunk pasted back shifted.
    Kept cells were computed after the old header, so the result is near a full prefill, not equal to it (on
    the real model within 0.05 nats, tests/test_chunk_reuse.py; this model's sharp attention moves it more).
    What the device must do is what the CPU does: the same operations, the same logits."""
    body = dev.text.tokenize(CODE * 2)[:400]
    old = dev.text.tokenize("cch=0a1b;") + body
    new = dev.text.tokenize("cch=9z8y7x6w;") + body + dev.text.tokenize(" #")
    keep = next(i for i, (x, y) in enumerate(zip(old, new, strict=False)) if x != y)
    chunks = plan(old, new, keep, 16)
    assert chunks and chunks[0].shift != 0
    got = _cut_and_paste(dev, old, new, keep, chunks)
    on_cpu = _cut_and_paste(cpu, old, new, keep, chunks)
    want = _fresh_logits(dev_fresh, KV("f16"), new[:-1], new[-1])
    dev_fresh.open(KV("f16"), 1, 1024)
    wiped = dev_fresh.steps.next_logits(0, new[-1], 0)
    kl_cpu, kl, kl_wiped = _kl_nats(got, on_cpu), _kl_nats(got, want), _kl_nats(wiped, want)
    print(f"shifted by {chunks[0].shift}: KL {kl_cpu:.2e} nats against the CPU's cut and paste; {kl:.4f} against "
          f"a full prefill (wiped: {kl_wiped:.3f})")
    assert kl_cpu < CROSS_KL_NATS["f16"] and np.argmax(got) == np.argmax(on_cpu)
    assert kl < kl_wiped / 10


def test_prefix_copy_between_agents_continues_the_donors_prefix(dev, dev_fresh):
    tokens = dev.text.tokenize(CODE)[:240]
    dev.open(KV("f16"), 2, 512)
    _prefill(dev, 0, tokens)
    dev.cells.copy(0, 1)
    dev.cells.truncate(1, 150)
    assert dev.cells.span(1) == (0, 149) and dev.cells.span(0) == (0, 239)
    got = dev.steps.next_logits(1, tokens[150], 150)
    want = _fresh_logits(dev_fresh, KV("f16"), tokens[:150], tokens[150])
    assert _kl_nats(got, want) < TOLERANCE_NATS["f16"]
    # and the donor's own cells are untouched by the copy
    want0 = _fresh_logits(dev_fresh, KV("f16"), tokens, tokens[0])
    assert _kl_nats(dev.steps.next_logits(0, tokens[0], 240), want0) < TOLERANCE_NATS["f16"]


@pytest.mark.parametrize("converted", [False, True])
def test_the_side_cache_probe_leaves_the_live_cache_as_it_was(dev, converted):
    dev.open(KV("f16"), 2, 512)
    dev.steps.seed_sampler(0, 1)
    tokens = dev.text.tokenize(CODE)[:120]
    _prefill(dev, 0, tokens)
    nxt = dev.text.tokenize("#")[0]
    cells, logits = dev.cells.span(0), dev.steps.next_logits(0, nxt, len(tokens))
    if converted:
        p = probe_kv_converted(dev, KV("f16"), KV("q8_0"), 2, 0, 90)
        assert p.prefill == {}
    else:
        p = probe_kv(dev, KV("f16"), KV("q8_0"), 2, 128)
    assert all(s > 0 for kv in p.decode for *_, s in p.decode[kv])
    assert (dev.kv, dev.n_seqs, dev.cells.span(0), dev.cells.span(1)) == (KV("f16"), 2, cells, (-1, -1))
    np.testing.assert_allclose(dev.steps.next_logits(0, nxt, len(tokens)), logits, atol=1e-4)


def test_the_live_quality_check_measures_on_the_device(dev):
    history = dev.text.tokenize(CODE * 2)[:300]
    q = QualityCheck()
    try:
        ev = q.check(dev, KV("q8_0"), history, agent_id=1)
        again = q.check(dev, KV("q8_0"), history, agent_id=1)
    finally:
        q.close()
    assert ev.context == 300 and 0 <= ev.check_kl < TOLERANCE_NATS["q8_0"] and ev.check_s > 0
    assert again.mean_kl is not None and again.mean_kl < TOLERANCE_NATS["q8_0"]


def test_preemption_under_a_kv_budget_re_prefills_and_keeps_the_rest(dev, dev_fresh):
    k = dev.facts.kv_bytes_per_token(KV("f16"))
    e = Engine(dev, EngineSettings(**{**SETTINGS, "kv_budget_bytes": 900 * k}))
    preempted = 0
    for _ in range(200):
        preempted += len(e.step().preempted)
    assert preempted
    assert _check(e, dev_fresh, most=4) >= 1


def test_the_check_catches_a_wiped_cache_on_the_device(dev):
    e = Engine(dev, EngineSettings(**SETTINGS))
    for _ in range(10):
        e.step()
    victim = next(a for a in e.agents if a.context)
    dev.cells.drop(victim.seq)
    with pytest.raises(CacheMismatch, match=f"agent {victim.id}"):
        e.step()


# Device against CPU: the same pinned llama.cpp, its CPU backend (cpu_only: no device in the model's list),
# the same history and setting. The kernels differ (the device's matmuls accumulate in another order, its
# flash attention is its own), so the logits differ by rounding: on this model a mean KL under 0.01 nats and
# the same top token at 95% of positions or more, where a context off by one cell moves the KL by nats
# (the wiped-cache contrast in the tests above). The thresholds leave 10x or more over what llvmpipe measured
# (docs/device.md); with 10 positions, 95% means every top token agrees.
CROSS_KL_NATS = {"f16": 0.01, "q8_0": 0.02}
CROSS_TOP1 = 0.95


@pytest.mark.parametrize("kv", ["f16", "q8_0"])
def test_the_devices_logits_agree_with_the_cpu_backends(dev, cpu, kv):
    if dev.device is None:
        pytest.skip("a CPU build: nothing to cross-check")
    tokens = dev.text.tokenize(CODE * 2)[:320]
    kls, same = [], []
    for b_pos in range(160, 320, 16):
        got = _fresh_logits(dev, KV(kv), tokens[:b_pos], tokens[b_pos])
        want = _fresh_logits(cpu, KV(kv), tokens[:b_pos], tokens[b_pos])
        kls.append(_kl_nats(got, want))
        same.append(int(np.argmax(got) == np.argmax(want)))
    print(f"{dev.info.device} vs CPU at {kv}: KL mean {np.mean(kls):.2e} max {max(kls):.2e} nats, "
          f"top-1 {np.mean(same):.0%}")
    assert np.mean(kls) < CROSS_KL_NATS[kv] and np.mean(same) >= CROSS_TOP1


def test_a_cache_the_device_cannot_hold_is_refused_in_one_line_and_changes_nothing(dev):
    """llama.cpp does not refuse a cache past the device's largest buffer: on Vulkan it aborts the process
    (ggml-backend.cpp: "pre-allocated tensor (cache_k_l0) in a buffer (Vulkan0) that cannot run the
    operation"). The backend asks first, and says so in one line."""
    if dev.device is None:
        pytest.skip("a CPU build: host memory, no device buffer to outgrow")
    dev.open(KV("f16"), 2, 256)
    _prefill(dev, 0, dev.text.tokenize(CODE)[:50])
    before = dev.cells.span(0), dev.kv, dev.n_seqs
    cells = 2 * dev.device.max_buffer_bytes // 256  # one layer's K: 2 heads x 64 x 2 bytes a cell
    with pytest.raises(UserError) as err:
        with dev.side_cache(KV("f16"), 1, cells):
            pass
    assert "\n" not in str(err.value) and dev.device.name in str(err.value), err.value
    assert (dev.cells.span(0), dev.kv, dev.n_seqs) == before
    with pytest.raises(UserError, match="fewer agents"):  # what a KV switch or a rebuild calls
        dev.open(KV("f16"), 2, cells)
    assert (dev.cells.span(0), dev.kv, dev.n_seqs) == before


def test_a_control_that_would_outgrow_the_device_is_refused_at_the_request(dev, monkeypatch):
    """Refused where it is asked, in one line, the engine as it was: in the rebuild it came too late (the
    old KV type would need the new streams as well)."""
    if dev.device is None:
        pytest.skip("a CPU build: host memory, no device buffer to outgrow")
    from dataclasses import replace

    e = Engine(dev, EngineSettings(**SETTINGS))  # 4 streams of 512 cells
    for _ in range(5):
        e.step()
    # this model's largest layer tensor, K at f16: 256 B a cell, 512 KiB for 4 x 512 cells. A device whose
    # largest buffer is 768 KiB holds that, not 8 streams (what 6 agents take) and not f32
    monkeypatch.setattr(dev, "device", replace(dev.device, max_buffer_bytes=768 << 10))
    before = e.state()
    with pytest.raises(UserError, match="largest buffer") as err:
        e.request(Control(agents=6))
    assert err.value.field == "agents" and "\n" not in str(err.value)
    with pytest.raises(UserError, match="largest buffer") as err:
        e.request(Control(kv=KV("f32")))
    assert err.value.field == "kv_type"
    assert e.state() == before
    e.request(Control(kv=KV("q8_0")))
    assert _rebuild(e).kv_type == "q8_0"
    e.step()


def test_the_fit_check_names_the_largest_buffer_and_the_free_memory():
    from swarmtune.engine.backends.devices import Device, why_cache_does_not_fit

    gib = 1 << 30
    d = Device("Vulkan", "Vulkan0", "llvmpipe (LLVM 15.0.6, 256 bits)", "gpu", 2 * gib, 2 * gib, gib)
    assert d.emulated and d.label == "Vulkan: llvmpipe (CPU-emulated)"
    assert why_cache_does_not_fit(d, gib // 2, gib, 2 * gib) is None
    assert "largest buffer (1.00 GiB)" in why_cache_does_not_fit(d, gib + 1, 2 * gib, 4 * gib)
    assert "1.50 GiB free" in why_cache_does_not_fit(d, gib // 2, 2 * gib, 3 * gib // 2)
    card = Device("CUDA", "CUDA0", "NVIDIA H100 80GB HBM3", "gpu", 80 * gib, 79 * gib, 80 * gib)
    assert not card.emulated and card.label == "CUDA: NVIDIA H100 80GB HBM3"


def test_sampling_runs_on_the_device_where_its_rows_align_and_keeps_greedy_tokens(tmp_path, dev):
    # llama.cpp samples in the decode graph on the device; it views each logits row at row x n_vocab x 4
    # bytes, which Vulkan aborts on where that is not a multiple of its alignment: the 259-token model
    # falls back to the host, a 320-token one (1,280-byte rows) samples on the device
    from swarmtune.engine.conversation.sampling import SamplingParams

    if dev.device is not None and dev.device.buffer_alignment > 4:
        assert dev.info.settings["sampling"].startswith("host: a logits row of 1,036 bytes")
    b = _backend(str(llama_device(tmp_path / "aligned.gguf", n_layer=N_LAYER, n_vocab=320)))
    try:
        assert b.info.settings["sampling"] == "device"
        greedy = SamplingParams(temperature=0.0)
        prompt = b.text.tokenize(CODE)[:40]
        runs = []
        for on_device in (False, True):
            b.samplers.device_sampling = on_device
            b.open(KV("f16"), 2, 256)
            ends = [29, 34]  # each sequence's prompt up to here prefilled; the token there fed to the decode
            for s in range(2):
                b.steps.set_sampler(s, greedy)
                _prefill(b, s, prompt[: ends[s]])
            assert b.samplers.on_host([0, 1]) == ([] if on_device else [0, 1])
            cur, pos, out = [prompt[e] for e in ends], list(ends), []
            for _ in range(12):
                cur, _s = b.steps.launch_decode([0, 1], cur, pos)()
                pos = [p + 1 for p in pos]
                out.append(list(cur))
            runs.append(out)
        assert runs[0] == runs[1]
    finally:
        b.close()


@pytest.mark.parametrize("n_vocab", [259, 320], ids=["drawn-on-host", "drawn-on-device"])
def test_drafts_verified_on_the_device_keep_greedy_tokens_and_every_cache(tmp_path, n_vocab, monkeypatch):
    # a verify step: every drafted row written on the device and drawn (in the graph where the rows align),
    # the rejected cells removed from a device cache; the cache check runs after every step
    from collections import defaultdict

    from swarmtune.engine.backends.llama_steps import LlamaSteps
    from swarmtune.engine.batch_runner import BatchRunner
    from swarmtune.engine.conversation.sampling import SamplingParams

    def greedy(self: LlamaSteps, seq: int, seed: int) -> None:
        self.live.samplers.set(seq, SamplingParams(temperature=0.0, seed=seed))

    path = str(llama_device(tmp_path / f"spec-{n_vocab}.gguf", n_layer=N_LAYER, n_vocab=n_vocab))
    goes_on = BatchRunner.goes_on
    runs = []
    for draft in (0, 4):
        streams: dict[int, list[int]] = defaultdict(list)
        ended: set[int] = set()

        def seen(self, a, tok, streams=streams, ended=ended) -> bool:
            if a.id not in ended:
                streams[a.id].append(tok)
            on = goes_on(self, a, tok)
            if not on:
                ended.add(a.id)
            return on

        monkeypatch.setattr(BatchRunner, "goes_on", seen)
        b = _backend(path)
        monkeypatch.setattr(LlamaSteps, "seed_sampler", greedy)
        e = Engine(b, EngineSettings(**{**SETTINGS, "gen_tokens": 48, "draft_tokens": draft, "reference": False}))
        assert e.s.check
        drafted = accepted = 0
        try:
            for _ in range(70):
                r = e.step()
                drafted, accepted = drafted + r.drafted, accepted + r.accepted
            e.land()
        finally:
            e.close()
        runs.append((dict(streams), drafted, accepted))
    (plain, _, _), (spec, drafted, accepted) = runs
    assert drafted > 0 and accepted > 0
    common = {i: min(len(t), len(spec.get(i, []))) for i, t in plain.items()}
    assert sum(common.values()) >= 60
    assert {i: spec[i][:n] for i, n in common.items()} == {i: plain[i][:n] for i, n in common.items()}
