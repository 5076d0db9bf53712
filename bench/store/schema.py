"""The results DB's shape: the migrations that build it (frozen once released: change the schema by appending one)
and the Arrow schemas of what the batched writer appends (tests check they match the tables column for column)."""

from __future__ import annotations

import pyarrow as pa

# Each migration is frozen once released: change the schema by appending one, never by editing one.
MIGRATIONS: list[tuple[int, str, list[str]]] = [
    (1, "initial schema", [
        """CREATE TABLE runs (
            run_id VARCHAR PRIMARY KEY, label VARCHAR, target VARCHAR, profile VARCHAR, config JSON,
            started_at DOUBLE NOT NULL, finished_at DOUBLE, status VARCHAR NOT NULL,
            capbench_version VARCHAR, pid INTEGER, hostname VARCHAR)""",
        """CREATE TABLE requests (
            run_id VARCHAR NOT NULL, request_id VARCHAR, phase VARCHAR, kind VARCHAR,
            scheduled_at DOUBLE, sent_at DOUBLE, first_token_at DOUBLE, finished_at DOUBLE,
            dispatch_lag_s DOUBLE, ttft_s DOUBLE, e2e_s DOUBLE, tpot_s DOUBLE, itl_s FLOAT[],
            prompt_tokens INTEGER, completion_tokens INTEGER, cached_tokens INTEGER, reasoning_tokens INTEGER,
            tokens_from VARCHAR, status VARCHAR, error_kind VARCHAR, error VARCHAR)""",
        """CREATE TABLE gpu_samples (
            run_id VARCHAR NOT NULL, t DOUBLE NOT NULL, gpu INTEGER, name VARCHAR,
            mem_used_mib DOUBLE, mem_total_mib DOUBLE, gpu_util_pct DOUBLE, mem_util_pct DOUBLE,
            power_w DOUBLE, sm_clock_mhz DOUBLE, mem_clock_mhz DOUBLE, temp_c DOUBLE)""",
        """CREATE TABLE server_samples (
            run_id VARCHAR NOT NULL, t DOUBLE NOT NULL, metric VARCHAR NOT NULL, labels VARCHAR, value DOUBLE)""",
        """CREATE TABLE integrity_events (
            run_id VARCHAR NOT NULL, t DOUBLE NOT NULL, kind VARCHAR, layer INTEGER, page BIGINT, detail VARCHAR)""",
        """CREATE TABLE latency_hist (
            run_id VARCHAR NOT NULL, metric VARCHAR NOT NULL, bucket INTEGER NOT NULL, n BIGINT NOT NULL)""",
    ]),
    (2, "request_stats: per-flush counts and sums, so a summary does not scan every request", [
        """CREATE TABLE request_stats (
            run_id VARCHAR NOT NULL, phase VARCHAR, status VARCHAR, error_kind VARCHAR, n BIGINT NOT NULL,
            first_due DOUBLE, first_sent DOUBLE, last_sent DOUBLE, last_finished DOUBLE,
            input_tokens BIGINT, output_tokens BIGINT,
            dispatch_lag_sum DOUBLE, dispatch_lag_n BIGINT, dispatch_lag_max DOUBLE)""",
        """INSERT INTO request_stats
            SELECT run_id, phase, status, error_kind, count(*), min(coalesce(scheduled_at, sent_at)), min(sent_at),
                   max(sent_at), max(finished_at), sum(prompt_tokens), sum(completion_tokens), sum(dispatch_lag_s),
                   count(dispatch_lag_s), max(dispatch_lag_s)
            FROM requests GROUP BY run_id, phase, status, error_kind""",
    ]),
    (3, "drift: quality drift between two servers, one row per prompt (bench/drift.py)", [
        """CREATE TABLE drift (
            run_id VARCHAR NOT NULL, target_a VARCHAR, target_b VARCHAR, prompt_id VARCHAR, kind VARCHAR,
            tokens_a INTEGER, tokens_b INTEGER, token_agreement DOUBLE, first_divergence INTEGER, mean_kl DOUBLE,
            exact_match BOOLEAN, tool_calls_match BOOLEAN, error VARCHAR)""",
    ]),
    (4, "requests.note: what did not fit the schema (stored as NULL) and why, instead of a dropped row", [
        "ALTER TABLE requests ADD COLUMN note VARCHAR",
    ]),
    (5, "campaigns: the benchmark matrix, its queue and its cells (bench/campaign)", [
        """CREATE TABLE campaigns (
            campaign_id VARCHAR PRIMARY KEY, name VARCHAR NOT NULL, digest VARCHAR, source VARCHAR, spec VARCHAR,
            status VARCHAR NOT NULL, submitted_at DOUBLE NOT NULL, started_at DOUBLE, finished_at DOUBLE,
            submitted_by VARCHAR, pid INTEGER, hostname VARCHAR)""",
        """CREATE TABLE campaign_cells (
            campaign_id VARCHAR NOT NULL, cell VARCHAR NOT NULL, deployment VARCHAR, load VARCHAR,
            status VARCHAR NOT NULL, started_at DOUBLE, finished_at DOUBLE, result JSON, error VARCHAR,
            log VARCHAR)""",
    ]),
    (6, "campaign_servers: each process group a campaign launched, recorded before its health wait (bench/campaign)", [
        """CREATE TABLE campaign_servers (
            campaign_id VARCHAR NOT NULL, deployment VARCHAR, pid INTEGER, pgid INTEGER, hostname VARCHAR,
            proc_start VARCHAR, stop_command VARCHAR, log VARCHAR, started_at DOUBLE, stopped_at DOUBLE)""",
    ]),
    (7, "requests.slot_wait_s: under a concurrency cap, the wait in the client for a free slot (not in ttft_s/e2e_s)", [
        "ALTER TABLE requests ADD COLUMN slot_wait_s DOUBLE",
    ]),
    (8, "eval: each suite problem's answer per endpoint, and long answers' agreement by position (bench/eval)", [
        """CREATE TABLE eval_answers (
            run_id VARCHAR NOT NULL, side VARCHAR, target VARCHAR, suite VARCHAR, problem_id VARCHAR,
            outcome VARCHAR, unparsed BOOLEAN, answer VARCHAR, detail VARCHAR, latency_s DOUBLE,
            completion_tokens INTEGER)""",
        """CREATE TABLE eval_positions (
            run_id VARCHAR NOT NULL, prompt_id VARCHAR, bin VARCHAR, bin_start INTEGER, positions INTEGER,
            agreed INTEGER, mean_kl DOUBLE, kl_positions INTEGER, first_divergence INTEGER)""",
    ]),
    (9, "load generator: a request's session and turn (closed-loop sessions), its time to the first content token "
        "(not reasoning: ttfc_s), the target it went to (several targets), and the node a GPU sample was scraped "
        "from (DCGM/Prometheus per node)", [
        "ALTER TABLE requests ADD COLUMN session_id VARCHAR",
        "ALTER TABLE requests ADD COLUMN turn INTEGER",
        "ALTER TABLE requests ADD COLUMN ttfc_s DOUBLE",
        "ALTER TABLE requests ADD COLUMN target VARCHAR",
        "ALTER TABLE gpu_samples ADD COLUMN node VARCHAR",
    ]),
    (10, "run_summaries: a run imported from a file that holds only the tool's summary (capbench import): its "
         "figures as the tool computed them, one row per metric and statistic, times in seconds", [
        """CREATE TABLE run_summaries (
            run_id VARCHAR NOT NULL, metric VARCHAR NOT NULL, stat VARCHAR NOT NULL, value DOUBLE, unit VARCHAR)""",
    ]),
]
# What the writer appends to request_stats for each flushed batch (the batch is registered as capbench_batch).
STATS_FROM_BATCH = """INSERT INTO request_stats
    SELECT run_id, phase, status, error_kind, count(*), min(coalesce(scheduled_at, sent_at)), min(sent_at),
           max(sent_at), max(finished_at), sum(prompt_tokens), sum(completion_tokens), sum(dispatch_lag_s),
           count(dispatch_lag_s), max(dispatch_lag_s)
    FROM capbench_batch GROUP BY run_id, phase, status, error_kind"""

SCHEMA_VERSION = MIGRATIONS[-1][0]
RUN_TABLES = ("runs", "requests", "gpu_samples", "server_samples", "integrity_events", "drift", "eval_answers",
              "eval_positions", "run_summaries")

# Arrow schemas of what the writer appends; tests check they match the tables column for column.
REQUESTS_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("request_id", pa.string()), ("phase", pa.string()), ("kind", pa.string()),
    ("scheduled_at", pa.float64()), ("sent_at", pa.float64()), ("first_token_at", pa.float64()),
    ("finished_at", pa.float64()), ("dispatch_lag_s", pa.float64()), ("ttft_s", pa.float64()),
    ("e2e_s", pa.float64()), ("tpot_s", pa.float64()), ("itl_s", pa.list_(pa.float32())),
    ("prompt_tokens", pa.int32()), ("completion_tokens", pa.int32()), ("cached_tokens", pa.int32()),
    ("reasoning_tokens", pa.int32()), ("tokens_from", pa.string()), ("status", pa.string()),
    ("error_kind", pa.string()), ("error", pa.string()), ("note", pa.string()), ("slot_wait_s", pa.float64()),
    ("session_id", pa.string()), ("turn", pa.int32()), ("ttfc_s", pa.float64()), ("target", pa.string()),
])
GPU_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("t", pa.float64()), ("gpu", pa.int32()), ("name", pa.string()),
    ("mem_used_mib", pa.float64()), ("mem_total_mib", pa.float64()), ("gpu_util_pct", pa.float64()),
    ("mem_util_pct", pa.float64()), ("power_w", pa.float64()), ("sm_clock_mhz", pa.float64()),
    ("mem_clock_mhz", pa.float64()), ("temp_c", pa.float64()), ("node", pa.string()),
])
SERVER_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("t", pa.float64()), ("metric", pa.string()), ("labels", pa.string()),
    ("value", pa.float64()),
])
INTEGRITY_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("t", pa.float64()), ("kind", pa.string()), ("layer", pa.int32()),
    ("page", pa.int64()), ("detail", pa.string()),
])
