"""The plausibility gate (hwprofiles.plausible, analyses.calibrate.unitslip): a
profile or stack number outside its physical range is refused naming the object,
the field and the likely unit; published rows in a wrong unit and fits that
move a field out of its range are refused unless --accept-poor-fit, which writes
a profile that loads (its sources say what was accepted)."""

from __future__ import annotations

import math

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from analyses.calibrate.publishedcal import calibrate_published
from analyses.cli import main
from hwprofiles import ProfileError, list_names, load_platform, load_stack, plausible
from hwprofiles.loader import _data_dir, load_file

A100 = "a100-sxm-8x"


def _shipped(kind: str) -> dict:
    return {n: yaml.safe_load((_data_dir(kind) / f"{n}.yaml").read_text())
            for n in list_names(kind)}


def _bounded_numbers():
    """(kind, file, path to the number in the YAML data, field, value, bound) of
    every shipped number that has a range."""
    out = []
    for name, data in _shipped("stacks").items():
        for field, value in data.items():
            bound = plausible.bound_of("stack", field)
            if bound and isinstance(value, (int, float)) and value > 0:
                out.append(("stacks", name, (field,), field, float(value), bound))
    for name, data in _shipped("platforms").items():
        for attr, kind in (("memory_tiers", "tier"), ("devices", "device"),
                           ("links", "link"), ("groups", "group")):
            for i, obj in enumerate(data.get(attr, [])[:1]):
                for field, value in obj.items():
                    bound = plausible.bound_of(kind, field, obj.get("kind"))
                    if bound and field != "peak_flops" and isinstance(value, (int, float, str)):
                        number = float(value)
                        if number > 0:
                            out.append(("platforms", name, (attr, i, field), field, number,
                                        bound))
    return out


NUMBERS = _bounded_numbers()


def test_every_shipped_profile_and_stack_is_plausible():
    found = [f.text for n in list_names("platforms") for f in plausible.problems(load_platform(n))]
    found += [f.text for n in list_names("stacks") for f in plausible.problems(load_stack(n))]
    assert found == [] and len(NUMBERS) > 20


def _write(tmp_path, kind, name, where, value):
    data = _shipped(kind)[name]
    node = data
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    path = tmp_path / f"{name}-edited.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pick=st.sampled_from(NUMBERS), power=st.sampled_from([-3, -2, -1, 1, 2, 3]))
def test_a_number_scaled_out_of_its_range_is_named_and_one_inside_loads(tmp_path, pick,
                                                                        power):
    """A shipped number x 10^power: outside its range, the loader names the file,
    the field and a slip; inside, the file loads."""
    kind, name, where, field, value, bound = pick
    scaled = value * 10 ** power
    path = _write(tmp_path, kind, name, where, scaled)
    if bound.lo <= scaled <= bound.hi:
        load_file(kind, path)
        return
    with pytest.raises(ProfileError) as err:
        load_file(kind, path)
    text = str(err.value)
    assert path.name in text and f"field {field} is" in text
    assert "slip" in text and plausible.ACCEPTED in text


@pytest.mark.parametrize("kind, name, where, value, words", [
    ("stacks", "hf-eager", ("layer_host_s",), 0.4685,
     "0.4685 milliseconds is 0.0004685 s"),
    ("platforms", A100, ("memory_tiers", 0, "bandwidth_gb_s"), 2.039,
     "2.039 TB/s is 2039 GB/s"),
    ("platforms", A100, ("devices", 0, "launch_overhead_s"), 40.93,
     "40.93 microseconds is 4.093e-05 s"),
    ("platforms", A100, ("memory_tiers", 0, "capacity_bytes"), 80,
     "80 GB is 8e+10 bytes"),
])
def test_a_unit_slip_names_the_unit(tmp_path, kind, name, where, value, words):
    with pytest.raises(ProfileError, match="slip") as err:
        load_file(kind, _write(tmp_path, kind, name, where, value))
    assert words in str(err.value)


def test_a_source_that_accepts_the_value_keeps_it(tmp_path):
    data = _shipped("stacks")["hf-eager"]
    data["layer_host_s"] = 0.02
    data["sources"]["layer_host_s"] += f" ({plausible.ACCEPTED}: a debug build)"
    path = tmp_path / "slow.yaml"
    path.write_text(yaml.safe_dump(data))
    assert load_file("stacks", path).layer_host_s == 0.02


def _published(tmp_path, name, edit) -> str:
    rows = [r for r in yaml.safe_load((_data_dir("published") / "measurements.yaml")
                                      .read_text())["measurements"]
            if r["platform"] == A100 and r.get("tokens_per_s")]
    for r in rows:
        edit(r)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"measurements": rows}, sort_keys=False))
    return str(path)


def _in_microseconds(row):
    row["time_per_token_ms"] = round(1e6 / row.pop("tokens_per_s"), 4)


@pytest.mark.parametrize("edit, words", [
    (lambda r: r.update(tokens_per_s=r["tokens_per_s"] / 100), "a slip of about 100x"),
    (_in_microseconds, "typed in microseconds per token"),
    (lambda r: r.update(tokens_per_s=r["tokens_per_s"] * 60), "typed in tokens per minute"),
])
def test_published_rows_in_a_wrong_unit_are_named(tmp_path, capsys, edit, words):
    path = _published(tmp_path, "slip", edit)
    out = tmp_path / "cal.yaml"
    assert main(["calibrate", "--published", path, "--profile", A100, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "row gptfast-a100-llama2-7b-tp1 (line 2)" in err and words in err
    assert not out.exists()


def test_a_fit_to_rows_100x_slow_is_refused_and_written_only_when_accepted(tmp_path):
    path = _published(tmp_path, "div100", lambda r: r.update(
        tokens_per_s=r["tokens_per_s"] / 100))
    out = tmp_path / "cal.yaml"
    with pytest.raises(ValueError, match="nothing written: row "):
        calibrate_published(path, A100, out)
    summary = calibrate_published(path, A100, out, accept_poor_fit=True)
    moved = [p for p in summary["problems"] if p.startswith("the fit moves memory_efficiency")]
    assert moved and "outside its plausible range" in moved[0]
    written = load_platform(str(out))  # it loads: its sources accept the values
    efficiency = written.memory_tiers[0].memory_efficiency
    assert efficiency < plausible.BOUNDS["tier"]["memory_efficiency"].lo
    assert plausible.ACCEPTED in written.memory_tiers[0].sources["memory_efficiency"]
    assert math.isfinite(efficiency)
