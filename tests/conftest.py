import os

# One intra-op thread for torch in every test process and the subprocesses they start (the environment is inherited).
# The suite runs three xdist workers and the Locust process on two cores: torch's second thread only waits for a
# core, and a step of SGLang's pool code over a few hundred rows took 22 ms instead of 0.5 ms. One HiCache partial-page
# trial pair: 10.4 s with two threads, 0.84 s with one (a loaded host). Product code sets its own threads.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Locust monkey-patches the whole process with gevent when it is imported; done after ssl is imported (by httpx,
# aiohttp, ...) it recurses forever. So the tests that import Locust run in a pytest process of their own, which
# patches first of all: `make test` runs `pytest` (everything else), then `CAPBENCH_TESTS=locust pytest`.
LOCUST_TESTS = ("tests/loadgen", "tests/bench/test_runner.py", "tests/bench/test_runner_twin.py",
                "tests/bench/test_load_sweep.py", "tests/bench/test_calibrate.py",
                "tests/bench/cli/test_cli_fuzz.py", "tests/bench/test_run_kills.py",
                "tests/e2e/test_demo.py")
LOCUST_PART = os.environ.get("CAPBENCH_TESTS") == "locust"
# The long ones (each file's tests together take tens of seconds on 2 cores): `make test` runs them, `make test-fast`
# (-m "not slow") leaves them out. A test may also carry @pytest.mark.slow itself. The longest first: they run first.
SLOW_TESTS = ("tests/bench/campaign/test_campaign_run.py", "tests/bench/campaign/test_ownership.py", "tests/e2e",
              "tests/dashboard/test_apptest_planner.py", "tests/engine_patches/test_kv_checksum_detection.py",
              "tests/engine_patches/test_kv_checksum_partial.py",
              "tests/bench/test_calibrate.py", "tests/engine_patches/test_int4_sglang_load.py")
# Files whose tests together took 10 s or more in `make test-fast` (a loaded 2-core host, --durations): marked slow
# too, in their own order. `make test-fast` keeps the unit tests and, of these, one end-to-end path per surface
# (FAST_PATHS): the CLI's plan, a report over runs, a campaign file's checks, an import, an eval, the twin's OpenAI
# API, a patched SGLang launch line; the dashboard's AppTest pages are not slow. Not in it: the browser, Locust.
LONGER_TESTS = (
    "tests/bench/campaign/test_hostile_campaigns.py",
    "tests/bench/campaign/test_nothing_outlives.py",
    "tests/bench/campaign/test_pd_check_launch.py",
    "tests/bench/campaign/test_pd_campaign.py",
    "tests/bench/cli/test_plan_campaign.py",
    "tests/bench/test_user_files.py",
    "tests/engine_patches/test_fp8_scales_launch.py",
    "tests/bench/imports/test_import_summaries.py",
    "tests/bench/cli/test_plan_pd.py",
    "tests/bench/cli/test_first_screen.py",
    "tests/bench/campaign/test_shell_values.py",
    "tests/engine_patches/test_kv_checksum_launch.py",
    "tests/bench/campaign/test_campaign_nodes.py",
    "tests/bench/report/test_report.py",
    "tests/engine_patches/test_expert_formats_sglang_load.py",
    "tests/bench/imports/test_import_results.py",
    "tests/bench/cli/test_plan_prices.py",
    "tests/engine_patches/test_int4_resume.py",
    "tests/bench/eval/test_eval_cli.py",
    "tests/engine_patches/test_expert_formats_roundtrip.py",
    "tests/dashboard/test_apptest_own_slo.py",
    "tests/bench/cli/test_plan.py",
    "tests/bench/test_repeat.py",
    "tests/engine_patches/test_gpu_check.py",
    "tests/bench/campaign/test_common_requests.py",
    "tests/bench/cli/test_runs.py",
    "tests/engine_patches/test_int4_convert.py",
    "tests/bench/model/test_formats.py",
    "tests/engine_patches/test_kv_checksum_gpu_check.py",
    "tests/engine_patches/test_no_torch.py",
    "tests/bench/twin/test_twin.py",
    "tests/bench/campaign/test_runtime_keys.py",
    "tests/bench/campaign/test_predict.py",
    "tests/engine_patches/test_int4_moe.py",
    "tests/bench/campaign/test_eval_stage.py",
    "tests/engine_patches/test_kv_checksum_step.py",
    "tests/bench/campaign/test_flags.py",
    "tests/bench/model/test_validate.py",
    "tests/engine_patches/test_kv_checksum_fuzz.py",
    "tests/dashboard/test_apptest_runs.py",
    "tests/bench/campaign/test_sweep.py",
    "tests/engine_patches/test_launch_roundtrip.py",
    "tests/bench/eval/test_suites.py",
    "tests/bench/test_drift.py",
    "tests/engine_patches/test_quant_cli.py",
    "tests/bench/twin/test_twin_pd.py",
    "tests/bench/eval/test_sandbox.py",
    "tests/bench/model/test_interval.py",
    "tests/bench/report/test_charts_without_v8.py",
    "tests/engine_patches/test_fp8_scales_mtp.py",
    "tests/bench/cli/test_serve_queue_entries.py",
    "tests/bench/test_node_telemetry.py",
    "tests/bench/model/test_plan.py",
    "tests/bench/campaign/test_pd_spec.py",
    "tests/bench/cli/test_serve_queue_folder.py",
)
FAST_PATHS = (
    "tests/bench/cli/test_plan.py::test_json_has_the_figures",
    "tests/bench/report/test_report.py::test_report_with_runs_has_tables_charts_and_the_measurements",
    "tests/bench/campaign/test_runtime_keys.py::test_a_bad_interpreter_or_image_is_one_line",
    "tests/bench/imports/test_import_results.py::test_bench_serving_runs_import_one_per_line_with_derived_e2e",
    "tests/bench/eval/test_eval_cli.py::test_one_target_stores_every_answer_with_its_data_version",
    "tests/bench/twin/test_twin.py::test_openai_client_chat_and_completions_not_streamed",
    "tests/engine_patches/test_fp8_scales_launch.py::test_dry_run_passes_the_scales_to_sglang",
)
if LOCUST_PART:
    from gevent import monkey

    monkey.patch_all()

import pytest  # noqa: E402

os.environ.setdefault("TRITON_INTERPRET", "1")
# The rate cache (model/serving/rate.py) of this test run only: answers are computed, never read from a user's
# cache. One folder for every process of the run (`make test` names it: its xdist workers, its Locust process and
# the subprocesses they start; else xdist's run id), so a plan one worker computed is not computed again by the
# next (the cache file is written under a lock). A plan for a report took 85 s of a 122 s `capbench report`.
_run = os.environ.get("CAPBENCH_TEST_CACHE") or (
    os.path.join(__import__("tempfile").gettempdir(), "capbench-cache-" + os.environ["PYTEST_XDIST_TESTRUNUID"])
    if "PYTEST_XDIST_TESTRUNUID" in os.environ else __import__("tempfile").mkdtemp(prefix="capbench-cache-"))
os.makedirs(_run, exist_ok=True)
os.environ["CAPBENCH_CACHE"] = _run
if not os.environ.get("CAPBENCH_TEST_CACHE") and "PYTEST_XDIST_TESTRUNUID" not in os.environ:
    __import__("atexit").register(__import__("shutil").rmtree, _run, True)  # a lone run's folder: never left in /tmp
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pytest_ignore_collect(collection_path, config):
    rel = os.path.relpath(str(collection_path), ROOT)
    if rel in ("tests", ".") or not rel.startswith("tests"):
        return None
    in_locust = any(rel == p or rel.startswith(p + os.sep) for p in LOCUST_TESTS)
    covers_locust = any(p.startswith(rel + os.sep) for p in LOCUST_TESTS)  # a folder holding some of them
    if LOCUST_PART:
        return None if in_locust or covers_locust else True
    return True if in_locust else None


def pytest_configure(config):
    # here, not in pyproject.toml: a change there reinstalls the venv (the Makefile's stamps depend on it)
    config.addinivalue_line("markers", "timing: bounds latencies or send rates to the millisecond; make test runs "
                                       "these alone, after the rest")


def _slow_rank(item: pytest.Item) -> int:
    """The item's place in SLOW_TESTS; len(SLOW_TESTS) for a test outside it."""
    rel = os.path.relpath(str(item.path), ROOT)
    return next((i for i, p in enumerate(SLOW_TESTS) if rel == p or rel.startswith(p + os.sep)), len(SLOW_TESTS))


def pytest_collection_modifyitems(config, items):
    for item in items:
        rel = os.path.relpath(str(item.path), ROOT)
        path = rel + "::" + item.name.split("[")[0]
        if _slow_rank(item) < len(SLOW_TESTS) or (rel in LONGER_TESTS and path not in FAST_PATHS):
            item.add_marker(pytest.mark.slow)
    collected = {os.path.relpath(str(item.path), ROOT) for item in items}
    named = {os.path.relpath(str(item.path), ROOT) + "::" + item.name.split("[")[0] for item in items}
    stale = [p for p in FAST_PATHS if p.split("::")[0] in collected and p not in named]
    if stale:
        raise pytest.UsageError(f"tests/conftest.py FAST_PATHS names tests that do not exist: {stale}")
    # The slow files first, longest first: pytest-xdist (--dist loadfile) hands out files in this order, so the long
    # ones start at once and no worker is left running one of them alone at the end. A file's order is kept.
    items.sort(key=_slow_rank)


def _define_torchvision_ops() -> None:
    """PyPI's torchvision is a CUDA build; beside CPU torch it fails on import with
    "operator torchvision::nms does not exist". SGLang's config package imports it, so tests
    define the two op schemas it registers fakes for before anything imports torchvision."""
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _define_torchvision_ops.lib = lib  # keep the library alive


_define_torchvision_ops()


@pytest.fixture
def tmp_db(tmp_path):
    return tmp_path / "capbench.duckdb"


@pytest.fixture(autouse=True)
def _keep_main_module():
    """Streamlit's AppTest runs a page as __main__ and leaves it in sys.modules; a later test whose code starts
    spawn processes (the INT4 converter) would then run that page in every child. Put the real one back."""
    import sys

    main = sys.modules.get("__main__")
    yield
    if main is not None:
        sys.modules["__main__"] = main
