"""Bad hardware profiles, model files, run settings and profile files, as a user (or
an attacker) could give them: each is refused with one sentence naming what is
wrong (exit 2, no traceback, no hang), or, where the review found the input valid,
accepted. Cases carry the reliability review's ids (Appendix A) and are grouped by
defect class: non-finite, boolean and out-of-range numbers (D3c, D13), placement
(D3d, D13), run sizes (D4), loader messages (D8), the size limit (D4), the memo
(D10), escape sequences (D12). A hypothesis fuzz test mutates shipped platforms.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clicases import Hang, assert_refused, digest, run_cli
from hwprofiles import load_platform
from hwprofiles.loader import MAX_PROFILE_BYTES

DATA = Path(__file__).parents[1] / "hwprofiles" / "data"
SIMULATE = ("simulate", "--target", "smollm2-135m", "--tokens", "50", "--policy", "sd",
            "--set", "draft_layers=15")


def shipped(kind: str, name: str) -> dict:
    """A shipped profile as plain data (anchors resolved, nothing shared)."""
    text = (DATA / kind / f"{name}.yaml").read_text()
    return json.loads(json.dumps(yaml.safe_load(text)))


def write_yaml(tmp_path: Path, name: str, data) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def simulate_platform(path: Path, *extra: str):
    return run_cli(SIMULATE[0], "--platform", path, *SIMULATE[1:], *extra)


# --- D3c, D13: numbers in a platform file --------------------------------------------

def _set(*path_and_value):
    """An edit of the cpu-local platform: set data[path...] = value (pairs)."""
    def edit(data):
        for i in range(0, len(path_and_value), 2):
            *keys, last = path_and_value[i]
            node = data
            for key in keys:
                node = node[key]
            node[last] = path_and_value[i + 1]
        return data
    return edit


TIER_BW = ("memory_tiers", 0, "bandwidth_gb_s")
PEAK = ("devices", 0, "peak_flops", "fp32")
LINK_LATENCY = ("links", 0, "latency_s")
PLATFORM_NUMBERS = [
    # id, edit, fragments of the sentence
    ("p17-nan-bandwidth", _set(TIER_BW, math.nan), ["memory_tiers.0.bandwidth_gb_s", "finite"]),
    ("p18-inf-bandwidth-and-flops", _set(TIER_BW, math.inf, PEAK, math.inf),
     ["memory_tiers.0.bandwidth_gb_s", "finite"]),
    ("p19-inf-capacity", _set(("memory_tiers", 0, "capacity_bytes"), math.inf),
     ["capacity_bytes", "finite"]),
    ("p20-inf-link-latency", _set(LINK_LATENCY, math.inf), ["links.0.latency_s", "finite"]),
    ("p21-inf-launch", _set(("devices", 0, "launch_overhead_s"), math.inf,
                            ("devices", 0, "sources", "launch_overhead_s"), "test"),
     ["launch_overhead_s", "finite"]),
    ("p22-nan-flops", _set(PEAK, math.nan), ["peak_flops", "finite"]),
    ("p23-negative-bandwidth", _set(TIER_BW, -1.0), ["bandwidth_gb_s"]),
    ("p24-tiny-bandwidth", _set(TIER_BW, 1e-300), ["bandwidth_gb_s", "greater than"]),
    ("p25-bandwidth-overflows-when-scaled", _set(TIER_BW, 1e308),
     ["bandwidth_gb_s", "less than"]),
    ("p26-huge-peak", _set(PEAK, 1e300), ["peak_flops.fp32", "between"]),
    ("p31-duplicate-group-member", _set(("groups", 0, "members"), ["cpu0", "cpu0"]),
     ["cpu0", "twice"]),
    ("p33-bool-flops", _set(PEAK, True), ["peak_flops", "true/false"]),
    ("bool-bandwidth", _set(TIER_BW, False), ["bandwidth_gb_s", "true/false"]),
    ("bool-latency", _set(LINK_LATENCY, True), ["latency_s", "true/false"]),
    ("subnormal-link-bandwidth", _set(("links", 0, "bandwidth_gb_s"), 5e-324),
     ["links.0.bandwidth_gb_s"]),
    ("int-beyond-float", _set(("memory_tiers", 0, "capacity_bytes"), 10 ** 400),
     ["capacity_bytes", "too large"]),
    ("2**64-latency", _set(LINK_LATENCY, 2 ** 64), ["latency_s", "less than"]),
    ("subnormal-efficiency", _set(("devices", 0, "compute_efficiency"), 5e-324,
                                  ("devices", 0, "sources", "compute_efficiency"), "test"),
     ["compute_efficiency"]),
    ("inf-string", _set(TIER_BW, "inf"), ["bandwidth_gb_s", "finite"]),
    ("word-for-number", _set(TIER_BW, "fast"), ["bandwidth_gb_s", "number"]),
    ("nan-group-alpha", _set(("groups", 0, "alpha_s"), math.nan), ["alpha_s", "finite"]),
    ("empty-placement-role", _set(("placement", ""), "cpu0"), ["empty role"]),
    # clean in the review already; kept so they stay clean
    ("p04-string-capacity", _set(("memory_tiers", 0, "capacity_bytes"), "lots"),
     ["capacity_bytes"]),
    ("p05-scalar-peaks", _set(("devices", 0, "peak_flops"), 5), ["peak_flops"]),
    ("p06-scalar-devices", _set(("devices",), 5), ["devices"]),
    ("p07-extra-field", _set(("foo",), 1), ["foo"]),
    ("p08-extra-device-field", _set(("devices", 0, "turbo"), True), ["turbo"]),
    ("p27-bad-tier-reference", _set(("devices", 0, "memory"), "nowhere"), ["nowhere"]),
    ("p28-no-link", _set(("links",), []), ["no link path"]),
    ("p29-source-not-text", _set(("memory_tiers", 0, "sources", "capacity_bytes"), 5),
     ["sources"]),
    ("p32-unknown-dtype", _set(("devices", 0, "peak_flops", "fp64"), 1e12), ["fp64"]),
]


@pytest.mark.parametrize("edit,fragments", [pytest.param(e, f, id=i)
                                            for i, e, f in PLATFORM_NUMBERS])
def test_platform_numbers_out_of_class_are_refused(tmp_path, edit, fragments):
    path = write_yaml(tmp_path, "platform.yaml", edit(shipped("platforms", "cpu-local")))
    before = digest(path)
    assert_refused(simulate_platform(path), *fragments)
    assert digest(path) == before


def test_p30_number_without_source_is_refused(tmp_path):
    data = shipped("platforms", "cpu-local")
    del data["memory_tiers"][0]["sources"]["capacity_bytes"]
    assert_refused(simulate_platform(write_yaml(tmp_path, "p.yaml", data)), "no source")


def test_numeric_strings_are_numbers_and_match_the_written_number(tmp_path):
    """YAML 1.1 reads 34.2e0 or 1e3 as strings; they are accepted as the numbers."""
    data = shipped("platforms", "cpu-local")
    as_float = load_platform(write_yaml(tmp_path, "a.yaml", data))
    data["memory_tiers"][0]["bandwidth_gb_s"] = "34.2e0"
    data["links"][0]["latency_s"] = "27.3e-6"
    as_text = load_platform(write_yaml(tmp_path, "b.yaml", data))
    assert as_text.memory_tiers[0].bandwidth_gb_s == as_float.memory_tiers[0].bandwidth_gb_s
    assert as_text.links[0].latency_s == as_float.links[0].latency_s


# --- model files (m-cases) -----------------------------------------------------------

def _model(**fields):
    data = shipped("models", "smollm2-135m")
    data.update(fields)
    return data


MODEL_FILES = [
    ("m00-zero-layers", _model(n_layers=0), ["n_layers"]),
    ("m01-heads-not-a-multiple", _model(n_heads=9, n_kv_heads=2), ["multiple"]),
    ("m02-huge-layers", _model(n_layers=300_000), ["n_layers"]),
    ("m03-huge-hidden", _model(hidden=10_000_000), ["hidden"]),
    ("m04-fractional-layers", _model(n_layers=2.5), ["n_layers"]),
    ("m05-unknown-dtype", _model(dtype="fp64"), ["dtype"]),
    ("m06-platform-as-model", shipped("platforms", "cpu-local"), ["n_layers"]),
    ("bool-layers", _model(n_layers=True), ["n_layers", "true/false"]),
    ("nan-hidden", _model(hidden=math.nan), ["hidden", "finite"]),
    ("vocab-beyond-float", _model(vocab=10 ** 400), ["vocab"]),
]


@pytest.mark.parametrize("data,fragments", [pytest.param(d, f, id=i)
                                            for i, d, f in MODEL_FILES])
def test_bad_model_files_are_refused(tmp_path, data, fragments):
    path = write_yaml(tmp_path, "model.yaml", data)
    result = run_cli("simulate", "--platform", "cpu-local", "--target", path,
                     "--tokens", "50", "--policy", "sd", "--set", "draft_layers=15")
    assert_refused(result, *fragments)


def test_a_check_across_fields_names_its_fields_without_a_placeholder(tmp_path):
    path = write_yaml(tmp_path, "model.yaml", _model(n_heads=9, n_kv_heads=2))
    result = run_cli("profiles", "validate", path)
    assert_refused(result, "model.yaml: n_heads (9) must be a multiple of n_kv_heads (2)")
    assert "field" not in result.sentence


def test_m10_ten_million_layers_through_a_streaming_policy_is_refused_at_once(tmp_path):
    path = write_yaml(tmp_path, "deep.yaml", _model(n_layers=10_000_000))
    result = run_cli("simulate", "--platform", "cpu-local", "--target", path, "--tokens",
                     "50", "--policy", "ar_stream", "--set", "dram_budget_gb=0.2")
    assert_refused(result, "n_layers", "less than")


# --- simulate settings: numbers, sizes, placement (s-cases, c30) ---------------------

SIM = ("simulate", "--platform", "cpu-local", "--target", "smollm2-135m", "--tokens", "50")
SD = ("--policy", "sd", "--set", "draft_layers=15")
MIRROR = ("--policy", "mirror", "--draft", "smollm2-135m")
SSD = ("--policy", "ssd", "--draft", "smollm2-135m")
CATS = ("--policy", "cats")
SETTINGS = [
    ("s01", ("--platform", "nope-platform", *SD), ["unknown platform"]),
    ("s02", ("--target", "nope-model", *SD), ["unknown model"]),
    ("s03", ("--policy", "nope"), ["unknown policy"]),
    ("s04", ("--policy", "sd", "--draft", "nope-model"), ["unknown model"]),
    ("s05", ("--policy", "sd"), ["--draft"]),
    ("s06-empty-platform", ("--platform", "", *SD), ["empty"]),
    ("s07-platform-is-a-directory", ("--platform", "/etc", *SD), ["directory"]),
    ("s10", (*SD, "--set", "alpha=1.5"), ["alpha"]),
    ("s11", (*SD, "--set", "alpha=-0.1"), ["alpha"]),
    ("s12", (*SD, "--set", "alpha=nan"), ["alpha"]),
    ("s13", (*SD, "--set", "alpha=inf"), ["alpha"]),
    ("s14", (*SD, "--set", "alpha=abc"), ["alpha"]),
    ("s15", (*SD, "--set", "gamma=0"), ["gamma"]),
    ("s16", (*SD, "--set", "gamma=-3"), ["gamma"]),
    ("s17", (*SD, "--set", "gamma=1000000000000"), ["gamma"]),
    ("s18", (*SD, "--set", "gamma=nan"), ["gamma"]),
    ("s19", (*SD, "--set", "gamma=2.5"), ["gamma"]),
    ("s20", (*SD, "--tokens", "0"), ["tokens"]),
    ("s21", (*SD, "--tokens", "-5"), ["tokens"]),
    ("s22-tokens-1e15", (*SD, "--tokens", "1000000000000000"), ["tokens", "cap"]),
    ("s23", (*SD, "--tokens", "1e3"), ["--tokens"]),
    ("s24", (*SD, "--batch", "0"), ["batch"]),
    ("s25", (*SD, "--batch", "-1"), ["batch"]),
    ("s26-batch-1e9", (*SD, "--batch", "1000000000"), ["batch", "cap"]),
    ("s27-negative-seed", (*SD, "--seed", "-1"), ["seed"]),
    ("s29", (*SD, "--set", "prompt_tokens=-1"), ["prompt_tokens"]),
    ("s30-prompt-tokens-1e24", (*SD, "--set", "prompt_tokens=1e24"),
     ["prompt_tokens", "cap"]),
    ("s31", (*SD, "--set", "contention=maybe"), ["contention"]),
    ("s32", (*SD, "--set", "alphas=1.2,0.5"), ["alpha"]),
    ("s33", (*SD, "--set", "histogram=0,0,0"), ["histogram"]),
    ("s34", (*SD, "--set", "histogram=-1,2"), ["histogram"]),
    ("s35-histogram-nan", (*SD, "--set", "histogram=nan,1"), ["finite"]),
    ("s36-histogram-inf", (*SD, "--set", "histogram=inf,1"), ["finite"]),
    ("s37", (*SD, "--set", "alphas=nan,0.5"), ["alpha"]),
    ("s40", (*SD, "--set", "=5"), ["KEY=VALUE"]),
    ("s41", (*SD, "--set", "gamma"), ["KEY=VALUE"]),
    ("s42", (*SD, "--set", "foo=1"), ["foo"]),
    ("s43", (*SD, "--set", "gamma="), ["gamma"]),
    ("s44", (*SD, "--set", "alpha=0.8", "--set", "alphas=0.5"), ["conflicts"]),
    ("s45", (*SD, "--acceptance", "bogus"), ["bogus"]),
    ("s46", (*SD, "--acceptance", "trace"), ["--set trace="]),
    ("s47", (*SD, "--set", "gämma =5"), ["gämma"]),
    ("s50", (*SD, "--placement", "draft"), ["ROLE=DEVICE"]),
    ("s51-unknown-device", (*SD, "--placement", "target=gpu9"),
     ["target=gpu9", "cpu0, cpu1"]),
    ("s52-empty-role", (*SD, "--placement", "=cpu0"), ["ROLE=DEVICE"]),
    ("s53-empty-device", (*SD, "--placement", "target="), ["ROLE=DEVICE"]),
    ("role-twice", (*SD, "--placement", "target=cpu0,target=cpu1"), ["twice"]),
    ("s60", (*MIRROR, "--set", "omega=2"), ["omega"]),
    ("s62", (*MIRROR, "--set", "eta=0"), ["eta"]),
    ("s63", (*MIRROR, "--set", "exit_layer=100000"), ["exit_layer"]),
    ("s64", (*MIRROR, "--set", "rollout_ratio=nan"), ["rollout_ratio"]),
    ("s65-rollout-ratio-inf", (*MIRROR, "--set", "rollout_ratio=inf"),
     ["rollout_ratio", "finite"]),
    ("s70-fast-backup-inf", (*SSD, "--set", "hit_rate=0.7", "--set", "backup=fast",
                             "--set", "fast_backup_s=inf"), ["fast_backup_s", "finite"]),
    ("s72", (*SSD, "--set", "hit_rate=0.7", "--set", "k=33"), ["'k'"]),
    ("s73", (*SSD, "--set", "hit_rate=0.7", "--set", "budget=0"), ["budget"]),
    ("s74", (*SSD, "--set", "r=nan"), ["'r'"]),
    ("s75-r-inf", (*SSD, "--set", "r=inf"), ["'r'", "finite"]),
    ("s80", (*CATS, "--set", "dram_budget_gb=0"), ["dram_budget_gb"]),
    ("s81-dram-budget-inf", (*CATS, "--set", "dram_budget_gb=inf"),
     ["dram_budget_gb", "finite"]),
    ("s82", (*CATS, "--set", "dram_budget_gb=nan"), ["dram_budget_gb"]),
    ("s83", (*CATS, "--set", "dram_budget_gb=-1"), ["dram_budget_gb"]),
    ("s84", ("--policy", "kangaroo", "--set", "dram_budget_gb=0.2", "--set",
             "mean_accepted=nan"), ["mean_accepted"]),
    ("s85", ("--policy", "kangaroo", "--set", "dram_budget_gb=0.2", "--set", "l_dm=1000"),
     ["l_dm"]),
    ("s86", ("--policy", "ppsd", "--set", "exit_layer=0"), ["exit_layer"]),
    ("s87", ("--policy", "ppsd", "--set", "exit_layer=999"), ["exit_layer"]),
    ("s88", (*CATS, "--set", "dram_budget_gb=0.2", "--set", "chunk_layers=100000"),
     ["dram_budget_gb"]),
    ("bool-gamma", (*SD, "--set", "gamma=true"), ["gamma", "true/false"]),
    ("bool-prompt-tokens", (*SD, "--set", "prompt_tokens=yes"), ["true/false"]),
    ("corrections-huge", (*CATS, "--set", "dram_budget_gb=0.2", "--set",
                          "corrections=1000000000000000000"), ["corrections"]),
    ("draft-collectives-1e300", ("--policy", "sd", "--draft", "smollm2-135m", "--set",
                                 "draft_collectives=1e300"), ["draft_collectives"]),
    ("fast-backup-1e300", (*SSD, "--set", "hit_rate=0.7", "--set", "backup=fast", "--set",
                           "fast_backup_s=1e300"), ["fast_backup_s"]),
]


@pytest.mark.parametrize("argv,fragments", [pytest.param(a, f, id=i) for i, a, f in SETTINGS])
def test_bad_simulate_settings_are_refused(argv, fragments):
    args = list(SIM)
    for flag in ("--platform", "--target", "--tokens"):  # a case's own value wins
        if flag in argv:
            at = args.index(flag)
            del args[at:at + 2]
    assert_refused(run_cli(*args, *argv), *fragments)


def test_s28_seed_beyond_64_bits_is_valid():
    result = run_cli(*SIM, *SD, "--seed", str(2 ** 70))
    assert result.rc == 0, result.err


def test_c30_compare_with_an_unknown_placement_refuses_before_any_run(tmp_path):
    out = tmp_path / "c.html"
    result = run_cli("compare", "--platform", "cpu-local", "--target", "smollm2-135m",
                     "--draft", "none", "--policies", "ar,sd", "--set", "draft_layers=15",
                     "--sweep", "gamma=2..3", "--tokens", "50", "--jobs", "1",
                     "--placement", "target=gpu9", "-o", out)
    assert_refused(result, "gpu9", "cpu0")
    assert not out.exists()


def test_c35_compare_on_an_inf_bandwidth_platform_refuses(tmp_path):
    data = _set(TIER_BW, math.inf, PEAK, math.inf)(shipped("platforms", "cpu-local"))
    out = tmp_path / "c.html"
    result = run_cli("compare", "--platform", write_yaml(tmp_path, "inf_bw.yaml", data),
                     "--target", "smollm2-135m", "--draft", "none", "--policies", "ar,sd",
                     "--set", "draft_layers=15", "--sweep", "gamma=2..3", "--tokens", "50",
                     "--jobs", "1", "-o", out)
    assert_refused(result, "bandwidth_gb_s", "finite")
    assert not out.exists()


# --- D8, D4: profile files a loader must describe truthfully -------------------------

BOMB = "name: bomb\n" + "".join(
    f"l{i}: &l{i} [{', '.join([f'*l{i - 1}' if i else 'lol'] * 9)}]\n" for i in range(9))


def _file_fixture(tmp_path: Path, kind: str) -> Path:
    """A profile file of one kind; the big ones are written only when asked for."""
    platform_text = yaml.safe_dump(shipped("platforms", "cpu-local"), sort_keys=False)
    path = tmp_path / f"{kind}.yaml"
    contents = {
        "empty": "", "null": "null\n", "list": "- a\n- b\n", "scalar": "42\n",
        "bomb": BOMB,
        "pytag": "name: !!python/object/apply:os.system ['true']\n",
        "pytag2": "name: !!python/object/new:builtins.str ['x']\n",
        "syntax": "name: x\ndevices: [1,\n  2\nlinks: {\n",
        "nul": "name: x\x00\n",
    }
    if kind in contents:
        path.write_text(contents[kind])
    elif kind == "binary":
        path.write_bytes(b"\x00\x01\x82\xff\xfe" * 40)
    elif kind == "latin1":
        path.write_bytes("name: caf\u00e9\n".encode("latin-1"))
    elif kind == "dir":
        path.mkdir()
    elif kind == "big":  # a valid platform with a 1.5 MB description
        data = shipped("platforms", "cpu-local")
        data["description"] = "x" * 1_500_000
        path.write_text(yaml.safe_dump(data))
    elif kind == "big_junk":  # 50 MB of '1,': the review's 7 GB memory case
        with path.open("w") as f:
            f.write("k: [")
            for _ in range(25):
                f.write("1," * 1_000_000)
            f.write("1]\n")
    elif kind == "utf16":
        path.write_text(platform_text, encoding="utf-16")
    elif kind == "utf8bom":
        path.write_text(platform_text, encoding="utf-8-sig")
    return path


FILES = [
    # platform-file id, profiles-validate id, fixture, fragments
    ("p00-empty", "v00-empty", "empty", ["mapping"]),
    ("p01-null", "null", "null", ["mapping"]),
    ("p02-list", "v08-list", "list", ["mapping"]),
    ("p03-scalar", "scalar", "scalar", ["mapping"]),
    ("p09-alias-bomb", "v01-alias-bomb", "bomb", ["bomb.yaml"]),
    ("p10-python-tag", "v02-python-tag", "pytag",
     ["pytag.yaml", "line 1", "!!python/object/apply:os.system", "not allowed"]),
    ("p11-python-tag-new", "v03-python-tag-new", "pytag2",
     ["line 1", "!!python/object/new", "not allowed"]),
    ("p12-binary", "v04-binary", "binary", ["binary.yaml", "not UTF-8"]),
    ("latin-1", "latin-1", "latin1", ["latin1.yaml", "not UTF-8"]),
    ("syntax-error", "syntax-error", "syntax", ["syntax.yaml", "not valid YAML", "line 4"]),
    ("nul-character", "nul-character", "nul", ["nul.yaml", "#x0000"]),
    ("p14-big-valid", "v05-big-valid", "big", ["big.yaml", "1.5 MB", "1 MB limit"]),
    ("p15-big-junk", "v06-big-junk", "big_junk", ["big_junk.yaml", "MB limit"]),
    ("p16-directory", "v07-directory", "dir", ["dir.yaml", "directory"]),
    ("p34-nonexistent", "v14-nonexistent", "missing", ["missing.yaml", "does not exist"]),
]


@pytest.mark.parametrize("kind,fragments", [pytest.param(k, f, id=i) for i, _, k, f in FILES])
def test_bad_platform_files_are_described_truthfully(tmp_path, kind, fragments):
    path = _file_fixture(tmp_path, kind)
    assert_refused(simulate_platform(path), *fragments)


@pytest.mark.parametrize("kind,fragments", [pytest.param(k, f, id=i) for _, i, k, f in FILES])
def test_profiles_validate_describes_bad_files_the_same_way(tmp_path, kind, fragments):
    path = _file_fixture(tmp_path, kind)
    assert_refused(run_cli("profiles", "validate", path), *fragments)


@pytest.mark.parametrize("kind", ["utf16", "utf8bom"])
def test_p13_utf16_and_bom_files_are_valid_yaml(tmp_path, kind):
    """YAML allows UTF-16 and UTF-8 with a byte-order mark; such a platform loads."""
    path = _file_fixture(tmp_path, kind)
    assert run_cli("profiles", "validate", path).rc == 0
    result = simulate_platform(path)
    assert result.rc == 0, result.err


def test_size_limit_is_checked_before_reading(tmp_path, monkeypatch):
    """A file over the limit is refused from its size: it is never opened."""
    path = tmp_path / "sparse.yaml"
    with path.open("wb") as f:
        f.truncate(7 * 10 ** 9)  # 7 GB, sparse: no disk used
    opened = []
    real_open = Path.open
    monkeypatch.setattr(Path, "open", lambda self, *a, **k: opened.append(self)
                        or real_open(self, *a, **k))
    assert_refused(simulate_platform(path), "7000.0 MB", "limit")
    assert path not in opened
    assert MAX_PROFILE_BYTES == 1_000_000


@pytest.mark.parametrize("argv,fragments", [
    pytest.param(("profiles", "show", "nope"), ["nope", "no shipped platform or model"], id="v20"),
    pytest.param(("profiles",), ["ACTION"], id="v21"),
    pytest.param(("profiles", "show", "/etc"), ["/etc", "directory"], id="v22-show-dir"),
    pytest.param(("profiles", "validate", "/etc"), ["/etc", "directory"], id="validate-etc"),
    pytest.param(("profiles", "validate", "/dev/zero"), ["regular file"], id="device"),
])
def test_profiles_subcommand_refusals(argv, fragments):
    assert_refused(run_cli(*argv), *fragments)


VALIDATE_MODELS = {"v09-zero-layers": "m00-zero-layers", "v10-heads": "m01-heads-not-a-multiple",
                   "v11-fractional-layers": "m04-fractional-layers",
                   "v12-unknown-dtype": "m05-unknown-dtype"}


@pytest.mark.parametrize("data,fragments", [
    pytest.param(d, f, id=v) for v, m in VALIDATE_MODELS.items()
    for i, d, f in MODEL_FILES if i == m])
def test_profiles_validate_refuses_bad_models(tmp_path, data, fragments):
    path = write_yaml(tmp_path, "model.yaml", data)
    assert_refused(run_cli("profiles", "validate", path), *fragments)


@pytest.mark.parametrize("name", [pytest.param("<script>alert(1)</script>", id="v13-markup"),
                                  pytest.param("ünïcødé-平台-🚀", id="v23-unicode")])
def test_v13_v23_unusual_but_printable_names_are_valid(tmp_path, name):
    data = shipped("platforms", "cpu-local")
    data["name"] = name
    result = run_cli("profiles", "validate", write_yaml(tmp_path, f"{name[:3]}.yaml", data))
    assert result.rc == 0 and name in result.out


# --- D12: no terminal escape sequences from a file reach the terminal ----------------

def test_validate_escapes_control_characters_in_the_name_and_path(tmp_path):
    data = shipped("platforms", "cpu-local")
    data["name"] = "\x1b]0;owned\x07\x1b[31mred"
    path = write_yaml(tmp_path, "esc\x1b[2J.yaml", data)
    result = run_cli("profiles", "validate", path)
    assert result.rc == 0
    assert "\x1b" not in result.out and "\x07" not in result.out
    assert "\\x1b]0;owned\\x07\\x1b[31mred" in result.out


def test_error_sentences_escape_control_characters_from_the_file(tmp_path):
    data = shipped("platforms", "cpu-local")
    data["devices"][0]["memory"] = "\x1b[31mnowhere"
    result = simulate_platform(write_yaml(tmp_path, "p.yaml", data))
    assert_refused(result, "\\x1b[31mnowhere")
    assert "\x1b" not in result.err


# --- D10, D15: the memo sees every rewrite; validate parses once ---------------------

def test_memo_sees_a_rewrite_that_keeps_mtime_and_size(tmp_path):
    data = shipped("platforms", "cpu-local")
    data["memory_tiers"][0]["bandwidth_gb_s"] = 11.0
    path = write_yaml(tmp_path, "p.yaml", data)
    assert load_platform(path).memory_tiers[0].bandwidth_gb_s == 11.0
    stamp = path.stat()
    data["memory_tiers"][0]["bandwidth_gb_s"] = 99.0  # same length: same size
    write_yaml(tmp_path, "p.yaml", data)
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # as cp -p, rsync -t
    assert path.stat().st_size == stamp.st_size
    assert load_platform(path).memory_tiers[0].bandwidth_gb_s == 99.0


def test_validate_parses_the_file_once(tmp_path, monkeypatch):
    import hwprofiles.loader as loader

    calls = []
    real = loader._parse
    monkeypatch.setattr(loader, "_parse", lambda *a: calls.append(a) or real(*a))
    path = write_yaml(tmp_path, "fresh.yaml", shipped("platforms", "snapdragon-8-gen3"))
    assert run_cli("profiles", "validate", path).rc == 0
    assert len(calls) == 1


def test_every_shipped_profile_validates():
    for path in sorted(DATA.glob("platforms/*.yaml")) + sorted(DATA.glob("models/*.yaml")):
        result = run_cli("profiles", "validate", path)
        assert result.rc == 0, (path, result.err)
    from analyses.calibrate.published import load_published  # the published measurements

    for path in sorted(DATA.glob("published/*.yaml")):
        assert load_published(path)


# --- fuzz: shipped platforms with extreme numbers and structural edits ---------------

FUZZ_PLATFORMS = ("cpu-local", "snapdragon-8-gen3", "jetson-agx-orin-64gb", "h100-sxm-5x")
# values outside every range, and values at the edges of the ranges (valid, extreme)
EXTREMES = (math.inf, -math.inf, math.nan, -0.0, -1, 5e-324, 1e-300, 1e308, True, False,
            "inf", "nan", 10 ** 400, 2 ** 64,
            0, 0.0, 1e-12, 1e-6, 1e-3, 0.5, 1.0000001, "1e3", 27.3, 1e3, 1e6, 1e12,
            1e18, 1e21)
POLICIES = {"ar": (), "sd": ("--set", "draft_layers=2"),
            "mirror": ("--draft", "smollm2-135m"),
            "cats": ("--set", "dram_budget_gb=0.2"),
            "ssd": ("--draft", "smollm2-135m", "--set", "hit_rate=0.7")}


def _numeric_paths(node, path=()):
    """Paths to every number in a profile (sources excluded)."""
    if isinstance(node, dict):
        items = node.items()
    elif isinstance(node, list):
        items = enumerate(node)
    else:
        return [path] if isinstance(node, (int, float)) and not isinstance(node, bool) else []
    return [p for k, v in items if k != "sources" for p in _numeric_paths(v, (*path, k))]


def _structural(data, choice: int):
    """One structural edit of a platform, chosen by number (none where an earlier
    edit removed what it edits)."""
    edits = [
        lambda d: d["devices"][0].pop("memory"),
        lambda d: d.pop("links", None),
        lambda d: d["groups"][0].update(members=[d["devices"][0]["name"]] * 2)
        if d.get("groups") else None,
        lambda d: d["devices"][0].update(name="renamed"),
        lambda d: d["placement"].update(target="nowhere"),
        lambda d: d["placement"].update({"": d["devices"][0]["name"]}),
        lambda d: d.update(memory_tiers=d["memory_tiers"][0]),
        lambda d: d["devices"][0].update(peak_flops=[1e12]),
        lambda d: d["memory_tiers"][0].pop("sources"),
        lambda d: d["devices"].append(dict(d["devices"][0])),
    ]
    with contextlib.suppress(LookupError, TypeError, AttributeError):  # edited away
        edits[choice % len(edits)](data)


@st.composite
def mutated_platforms(draw):
    name = draw(st.sampled_from(FUZZ_PLATFORMS))
    data = shipped("platforms", name)
    for _ in range(draw(st.integers(1, 3))):
        paths = _numeric_paths(data)
        if paths and draw(st.integers(0, 99)) < 70:
            *keys, last = draw(st.sampled_from(paths))
            node = data
            for key in keys:
                node = node[key]
            node[last] = draw(st.sampled_from(EXTREMES))
        else:
            _structural(data, draw(st.integers(0, 100)))
    return data


def _finite_metrics(stdout: str) -> None:
    metrics = json.loads(stdout)
    for key in ("tokens_per_s", "step_latency_s", "simulated_time_s", "speedup_vs_ar"):
        value = metrics[key]
        assert isinstance(value, (int, float)) and math.isfinite(value) and value > 0, \
            (key, value)


@settings(max_examples=200, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=mutated_platforms(), policy=st.sampled_from(sorted(POLICIES)))
def test_fuzzed_platforms_run_with_finite_metrics_or_refuse_in_one_sentence(
        tmp_path, data, policy):
    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    try:
        result = run_cli("simulate", "--platform", path, "--target", "smollm2-135m",
                         "--tokens", "8", "--policy", policy, *POLICIES[policy], "--json")
    except Hang:
        pytest.fail(f"hang: {policy} on {yaml.safe_dump(data)[:2000]}")
    if result.rc == 0:
        _finite_metrics(result.out)
    else:
        assert_refused(result)
