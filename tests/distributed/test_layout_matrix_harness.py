"""The layout-matrix harness's own bookkeeping (layout_matrix.py), without msrun: which groups
a session launches, what a plan entry holds, and the per-case failure messages (a case that
raised on a rank; a case the launch never reached)."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from layout_matrix import Group, JobCase, LayoutMatrix, TrainerCase, needed_groups, plan_entry  # noqa: E402,E501


def matrix(tmp_path, cases):
    m = LayoutMatrix({"g": Group("g", None, cases)}, {"g"}, str(tmp_path))
    out = tmp_path / "world2"
    (out / "logs").mkdir(parents=True)
    (out / "logs" / "worker_1.log").write_text("rank 1 said goodbye")
    proc = subprocess.CompletedProcess([], 1, "", "launcher: failing worker: rank 1")
    m._launched[2] = {"proc": proc, "out": str(out),
                      "plan": [{"name": c.name} for c in cases], "seconds": 1.0}
    return m, out


def test_a_case_that_raised_names_itself_its_rank_and_the_traceback(tmp_path):
    m, out = matrix(tmp_path, [JobCase("a", 2, "x:y"), JobCase("b", 2, "x:y")])
    for r in (0, 1):
        (out / "a").mkdir(exist_ok=True)
        (out / "a" / f".done.rank{r}").write_text("{}")
    (out / "b").mkdir()
    (out / "b" / ".error.rank1").write_text("Traceback ...\nValueError: boom")
    assert m.case_dir("a") == str(out / "a")
    with pytest.raises(pytest.fail.Exception) as e:
        m.case_dir("b")
    msg = str(e.value)
    assert msg.startswith("layout case b (world 2) raised on rank 1:\nTraceback ...\n"
                          "ValueError: boom")
    assert "launcher exit 1" in msg and "rank 1 said goodbye" in msg


def test_a_case_the_launch_never_reached_names_the_case_that_stopped_it(tmp_path):
    m, out = matrix(tmp_path, [JobCase("a", 2, "x:y"), JobCase("b", 2, "x:y")])
    (out / "a").mkdir()
    (out / "a" / ".done.rank0").write_text("{}")
    with pytest.raises(pytest.fail.Exception, match=r"layout case b \(world 2\) did not finish "
                       r"on ranks \[0, 1\]: the launch stopped at case a \(cases in order: "
                       r"\['a', 'b'\]\)"):
        m.case_dir("b")
    with pytest.raises(KeyError, match="no layout case 'c'"):
        m.case("c")


def test_plan_entries_and_the_groups_a_session_needs(tmp_path):
    case = TrainerCase("pp2", 2, "configs/markov_check.yaml", ("training.steps=2",),
                       ("parallelism.pipeline_parallel=2",), ("training.local_batch_size=4",))
    entry = plan_entry(case, "/o/pp2", {})
    assert entry["target"] == "layout_matrix:train_case"
    assert entry["args"] == ["configs/markov_check.yaml", [
        "training.steps=2", "parallelism.pipeline_parallel=2",
        "checkpoint.save_path=/o/pp2/checkpoint"]]
    assert case.reference_overrides("/r") == ["training.steps=2", "training.local_batch_size=4",
                                              "checkpoint.save_path=/r/checkpoint"]
    # a resumed case: the worker resumes its own step-4 checkpoint after the run
    resumed = TrainerCase("cp", 4, "configs/markov_check.yaml", ("training.steps=6",),
                          resume_at=4)
    assert plan_entry(resumed, "/o/cp", {})["args"][2:] == [4]
    job = plan_entry(JobCase("j", 2, "m:f", ("{ckpt}", 3)), "/o/j", {"ckpt": "/c"})
    assert job == {"name": "j", "dir": "/o/j", "target": "m:f", "args": ["/c", 3]}

    class Item:
        module = type("M", (), {"LAYOUT_GROUPS": ("dp", "tp")})

    assert needed_groups([Item(), object()]) == {"dp", "tp"}


def test_a_case_that_resumes_another_launches_its_world_first_and_loads_its_checkpoint(
        tmp_path, monkeypatch):
    """``resume_from``: the source case's world is launched before the resuming one, whose
    plan entry loads the source's step checkpoint; within one launch the source must come
    first."""
    src = TrainerCase("eight", 8, "c.yaml", ("training.steps=5",))
    again = TrainerCase("four", 4, "c.yaml", ("training.steps=5",), resume_from=("eight", 2))
    m = LayoutMatrix({"g": Group("g", None, [src, again])}, {"g"}, str(tmp_path))
    launched = []
    monkeypatch.setattr(m, "launch", lambda world: launched.append(world))
    path = m._resume_path(again)
    assert launched == [8]
    assert path == str(tmp_path / "world8" / "eight" / "checkpoint"
                       / "mindformers_core_step00000002.safetensors")
    assert plan_entry(again, "/o/four", {}, path)["args"][1][-1] == f"checkpoint.load_path={path}"
    late = TrainerCase("late", 8, "c.yaml", resume_from=("later", 1))
    later = TrainerCase("later", 8, "c.yaml")
    m = LayoutMatrix({"g": Group("g", None, [late, later])}, {"g"}, str(tmp_path))
    with pytest.raises(ValueError, match=r"layout case late resumes later, which runs after it "
                                         r"in the same launch: list later first"):
        m._resume_path(late)
