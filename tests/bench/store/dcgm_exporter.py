"""A fake NVIDIA DCGM exporter on 127.0.0.1: the text dcgm-exporter 3.x serves at /metrics (its default counters
and a few DCGM_FI_PROF_* ones), for 2 H200s on one node, each scrape's values different and kept in `served`."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FIELDS = (  # (field, type, help) as dcgm-exporter's default-counters.csv names them
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", "Ratio of cycles the device memory interface is active."),
)
UUIDS = ("GPU-6f1b2c3d-0000-4a5b-8c9d-0123456789ab", "GPU-6f1b2c3d-1111-4a5b-8c9d-0123456789ab")
TOTAL_MIB = 143771.0  # an H200's framebuffer as DCGM counts it (used + free + reserved)


def values(scrape: int, gpu: int) -> dict[str, float]:
    """Scrape number `scrape`'s values for one GPU: every field moves from one scrape to the next."""
    used = 20000.0 + 1000.0 * ((scrape * 3 + gpu * 5) % 100)
    reserved = 545.0
    return {
        "DCGM_FI_DEV_SM_CLOCK": 1500.0 + 10 * ((scrape + gpu) % 40), "DCGM_FI_DEV_MEM_CLOCK": 2619.0,
        "DCGM_FI_DEV_GPU_TEMP": 40.0 + (scrape + 3 * gpu) % 30,
        "DCGM_FI_DEV_POWER_USAGE": 150.5 + 7 * ((scrape + gpu) % 80),
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 1e9 + scrape * 5e5,
        "DCGM_FI_DEV_GPU_UTIL": float((scrape * 7 + gpu * 50) % 101),
        "DCGM_FI_DEV_MEM_COPY_UTIL": float((scrape * 5 + gpu * 20) % 101), "DCGM_FI_DEV_FB_USED": used,
        "DCGM_FI_DEV_FB_FREE": TOTAL_MIB - used - reserved, "DCGM_FI_DEV_FB_RESERVED": reserved,
        "DCGM_FI_DEV_XID_ERRORS": 0.0, "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ((scrape * 7 + gpu * 50) % 101) / 100,
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ((scrape * 3) % 60) / 100, "DCGM_FI_PROF_DRAM_ACTIVE": 0.25 + gpu / 10,
    }


def text(scrape: int, hostname: str = "gpu-node-1") -> str:
    lines = []
    for field, kind, help_ in FIELDS:
        lines += [f"# HELP {field} {help_}", f"# TYPE {field} {kind}"]
        for gpu in (0, 1):
            labels = (f'gpu="{gpu}",UUID="{UUIDS[gpu]}",pci_bus_id="00000000:{0x18 + gpu:02X}:00.0",'
                      f'device="nvidia{gpu}",modelName="NVIDIA H200",Hostname="{hostname}",'
                      'DCGM_FI_DRIVER_VERSION="550.90.07"')
            v = values(scrape, gpu)[field]
            lines.append(f"{field}{{{labels}}} {v:g}")
    return "\n".join(lines) + "\n"


class FakeDcgm:
    """/metrics: `mode` good (the text above, one scrape more each time), garbage (HTML), or hang (2 s)."""

    def __init__(self, mode: str = "good", hostname: str = "gpu-node-1"):
        self.mode, self.hostname = mode, hostname
        self.served: list[dict[int, dict[str, float]]] = []  # each good scrape's values per GPU
        me = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                if self.path != "/metrics":
                    body, status = "not found", 404
                elif me.mode == "garbage":
                    body, status = "<html><body>{{ 502 Bad Gateway }}</body></html>\x00\xff", 200
                else:
                    if me.mode == "hang":
                        threading.Event().wait(2.0)
                    n = len(me.served)
                    me.served.append({g: values(n, g) for g in (0, 1)})
                    body, status = text(n, me.hostname), 200
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.end_headers()
                    self.wfile.write(body.encode("utf-8", "surrogateescape"))
                except OSError:
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
