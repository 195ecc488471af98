"""Warm-up schedules: hand-computed values, step indexing, exact resume, config errors."""

from __future__ import annotations

import io
import math

import pytest
import torch

from bertforge.optim import build_scheduler, schedule_lr

BASE = 1e-3


@pytest.mark.parametrize(
    "schedule, step, expected",
    [
        ("poly", 0, 0.0),                        # before any step
        ("poly", 5, 5e-4),                       # mid warm-up: 1e-3 * 0.05 / 0.1
        ("poly", 9, 9e-4),                       # last warm-up step
        ("poly", 10, 9.486832980505138e-4),      # end of warm-up: progress 0.1 -> sqrt(0.9)
        ("poly", 55, 6.708203932499369e-4),      # mid decay: sqrt(0.45)
        ("poly", 100, 0.0),                      # last step: progress 1
        ("poly", 130, 0.0),                      # past the end: stays 0, no complex root
        ("linear", 10, 1e-3),                    # (1 - 0.1) / (1 - 0.1)
        ("linear", 55, 5e-4),                    # 0.45 / 0.9
        ("linear", 100, 0.0),
        ("constant", 5, 5e-4),
        ("constant", 55, 1e-3),
        ("constant", 100, 1e-3),
    ],
)
def test_schedule_values(schedule, step, expected):
    got = schedule_lr(BASE, step, total_steps=100, warmup=0.1, schedule=schedule, power=0.5)
    assert got == pytest.approx(expected, rel=1e-12, abs=1e-18)


def test_power_and_zero_warmup():
    assert schedule_lr(2.0, 50, 100, 0.0, "poly", power=2.0) == pytest.approx(0.5)
    assert schedule_lr(2.0, 1, 100, 0.0, "poly") == pytest.approx(2.0 * math.sqrt(0.99))


def lrs_seen_by_optimizer(steps: int, total: int, schedule: str = "poly", warmup: float = 0.2):
    """The lr each optimizer.step() runs with, under the usual optimizer-then-scheduler order."""
    w = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([w, ], lr=BASE)
    sched = build_scheduler(opt, schedule, total_steps=total, warmup=warmup)
    seen = []
    for _ in range(steps):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return seen


@pytest.mark.parametrize("schedule", ["poly", "linear", "constant", "wsd"])
def test_optimizer_step_k_uses_progress_k_over_total(schedule):
    total = 20
    seen = lrs_seen_by_optimizer(total, total, schedule)
    # NVIDIA's order: the first optimizer step runs at progress 1/T, the last at progress 1.
    assert seen == [schedule_lr(BASE, k, total, 0.2, schedule) for k in range(1, total + 1)]
    assert seen[0] == BASE * (1 / total) / 0.2
    assert seen[2] == BASE * (3 / total) / 0.2              # k=3: still warming up
    # k=4: progress 0.2 ends warm-up; poly jumps to (1 - 0.2) ** 0.5, as NVIDIA's does
    assert seen[3] == pytest.approx(BASE * (math.sqrt(0.8) if schedule == "poly" else 1.0))
    assert seen[-1] == (BASE if schedule == "constant" else 0.0)


def test_resume_gives_bitwise_identical_sequence():
    total, stop = 37, 13
    uninterrupted = lrs_seen_by_optimizer(total, total)

    w = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([w], lr=BASE)
    sched = build_scheduler(opt, "poly", total_steps=total, warmup=0.2)
    seen = []
    for _ in range(stop):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    buf = io.BytesIO()
    torch.save({"opt": opt.state_dict(), "sched": sched.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)   # plain values only

    w2 = torch.nn.Parameter(torch.zeros(2))
    opt2 = torch.optim.SGD([w2], lr=123.0)        # deliberately different: state must win
    sched2 = build_scheduler(opt2, "poly", total_steps=total, warmup=0.2)
    opt2.load_state_dict(saved["opt"])
    sched2.load_state_dict(saved["sched"])
    for _ in range(total - stop):
        seen.append(opt2.param_groups[0]["lr"])
        opt2.step()
        sched2.step()
    assert seen == uninterrupted
    assert sched2.last_epoch == total


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(name="cosine"), "^schedule must be one of poly, linear, constant, wsd, got 'cosine'"),
        (dict(warmup=1.0), r"^warmup must be a finite number in \[0, 1\), got 1.0"),
        (dict(total_steps=0), "^total_steps must be an integer >= 1, got 0"),
        (dict(power=0.0), r"^power must be a finite number in \(0, 100\], got 0.0"),
        (dict(warmup=float("nan")), "^warmup must be a finite number"),
        (dict(decay=1.5), r"^decay must be a finite number in \[0, 1\], got 1.5"),
        (dict(decay_shape="cosine"), "^decay_shape must be one of linear, 1-sqrt, got 'cosine'"),
        (dict(min_lr_ratio=-0.1), r"^min_lr_ratio must be a finite number in \[0, 1\]"),
        (dict(name="wsd", warmup=0.5, decay=0.6),
         r"^warmup \+ decay must be at most 1 \(warm-up and decay cannot overlap\), "
         r"got 0.5 \+ 0.6"),
    ],
)
def test_bad_settings_raise_value_errors(kwargs, message):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=BASE)
    args = dict(name="poly", total_steps=10, warmup=0.1, power=0.5) | kwargs
    with pytest.raises(ValueError, match=message):
        build_scheduler(opt, **args)


@pytest.mark.parametrize(
    "shape, ratio, step, expected",
    [
        ("1-sqrt", 0.0, 0, 0.0),
        ("1-sqrt", 0.0, 5, 5e-4),                     # warm-up: 1e-3 * 0.05 / 0.1
        ("1-sqrt", 0.0, 10, 1e-3),                    # end of warm-up: the peak, no jump
        ("1-sqrt", 0.0, 50, 1e-3),                    # stable
        ("1-sqrt", 0.0, 80, 1e-3),                    # 20 steps left = the decay: still the peak
        ("1-sqrt", 0.0, 85, 5e-4),                    # s = 1 - 15/20 = 0.25: 1 - sqrt(0.25)
        ("1-sqrt", 0.0, 90, 1e-3 * (1 - 0.5**0.5)),   # s = 0.5: 1 - sqrt(0.5)
        ("1-sqrt", 0.0, 100, 0.0),                    # last step: s = 1
        ("1-sqrt", 0.0, 130, 0.0),                    # past the end: stays at the floor
        ("linear", 0.0, 90, 5e-4),                    # s = 0.5: 1 - 0.5
        ("linear", 0.0, 95, 2.5e-4),
        ("linear", 0.1, 90, 1e-3 * (0.1 + 0.9 * 0.5)),
        ("linear", 0.1, 100, 1e-4),                   # ends at min_lr_ratio * base
        ("1-sqrt", 0.1, 130, 1e-4),
    ],
)
def test_wsd_values(shape, ratio, step, expected):
    got = schedule_lr(BASE, step, total_steps=100, warmup=0.1, schedule="wsd", decay=0.2,
                      decay_shape=shape, min_lr_ratio=ratio)
    assert got == pytest.approx(expected, rel=1e-12, abs=1e-18)


def test_wsd_phase_boundaries_are_exact():
    # The decay starts after step T - dT for every T that divides evenly: no float crumb from
    # 1 - progress (which would make step 90 of 100 run at 0.99999998 of the peak).
    for total in (10, 100, 1000, 7038):
        last_stable = total - round(0.1 * total)
        assert schedule_lr(BASE, last_stable, total, 0.0, "wsd", decay=0.1) == BASE
        assert schedule_lr(BASE, last_stable + 1, total, 0.0, "wsd", decay=0.1) < BASE
    # decay 0: constant after warm-up, even past the end; decay 1: decays from the first step.
    assert schedule_lr(BASE, 150, 100, 0.0, "wsd", decay=0.0) == BASE
    assert schedule_lr(BASE, 50, 100, 0.0, "wsd", decay=1.0, decay_shape="linear") == 5e-4


def test_wsd_resume_is_bitwise_identical():
    total, stop = 41, 30
    kw = dict(total_steps=total, warmup=0.1, decay=0.3, decay_shape="linear", min_lr_ratio=0.05)

    def steps(opt, sched, n):
        out = []
        for _ in range(n):
            out.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        return out

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=BASE)
    uninterrupted = steps(opt, build_scheduler(opt, "wsd", **kw), total)
    assert uninterrupted[-1] == pytest.approx(0.05 * BASE, rel=1e-12)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=BASE)
    sched = build_scheduler(opt, "wsd", **kw)
    seen = steps(opt, sched, stop)
    buf = io.BytesIO()
    torch.save({"opt": opt.state_dict(), "sched": sched.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    opt2 = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=7.0)
    sched2 = build_scheduler(opt2, "wsd", **kw)
    opt2.load_state_dict(saved["opt"])
    sched2.load_state_dict(saved["sched"])
    assert seen + steps(opt2, sched2, total - stop) == uninterrupted


@pytest.mark.parametrize(
    "override, message",
    [
        ("--optim.schedule=cosine", "optim.schedule must be one of poly, linear, constant, wsd"),
        ("--optim.decay=1.5", r"optim.decay must be a finite number in \[0, 1\], got 1.5"),
        ("--optim.decay_shape=sqrt", "optim.decay_shape must be one of linear, 1-sqrt, got 'sqrt'"),
        ("--optim.min_lr_ratio=2", r"optim.min_lr_ratio must be a finite number in \[0, 1\]"),
        ("--optim.decay=0.8", r"optim.warmup \+ optim.decay must be at most 1"),  # warmup 0.2843
        ("--optim.name=stable_adamw", "optim.name must be one of lamb, adamw, decoupled_adamw, "
                                      "stableadamw, decoupled_stableadamw, muon, got 'stable_adamw'"),
    ],
)
def test_config_rejects_bad_schedule_and_optimizer_settings(override, message):
    from bertforge.config import PretrainConfig, load_config
    from bertforge.errors import ConfigError

    with pytest.raises(ConfigError, match=message) as err:
        load_config(PretrainConfig, None, ["--optim.schedule=wsd", override])
    assert "\n" not in str(err.value)


def test_config_builds_the_wsd_schedule_it_validated():
    from bertforge.config import PretrainConfig, load_config

    cfg = load_config(PretrainConfig, None, ["--optim.schedule=wsd", "--optim.warmup=0.1",
                                             "--optim.decay=0.2", "--optim.decay_shape=linear",
                                             "--optim.name=decoupled_stableadamw"])
    o = cfg.optim
    assert (o.schedule, o.decay, o.decay_shape, o.min_lr_ratio) == ("wsd", 0.2, "linear", 0.0)
    # warmup + decay = 1 exactly is allowed (no stable phase); 0.7 + 0.3 is not refused for
    # the last bit of its float sum.
    for warmup, decay in ((0.8, 0.2), (0.7, 0.3), (0.0, 1.0)):
        load_config(PretrainConfig, None, ["--optim.schedule=wsd", f"--optim.warmup={warmup}",
                                           f"--optim.decay={decay}"])
