"""Render the README's figures to PNG: real runs on this machine, drawn by paralab.viz, photographed
by headless Chromium (Debian's package, driven by playwright; no browser download).

    .venv/bin/python docs/images/render.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import paralab
from paralab import viz
from paralab.schedules import build_schedule
from paralab.sim.bridge import predict_run_trace
from paralab.sim.events import simulate_schedule

HERE = Path(__file__).parent
CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]
ZB_TIMES = {"forward": 1e-3, "backward_input": 1e-3, "backward_weight": 1e-3}  # 1 ms each


def figures() -> dict:
    ddp = paralab.run("ddp", 2, steps=3, bucket_mb=0.1)
    pp = paralab.run("pp", 4, steps=2, pp=4, schedule="1f1b", microbatches=8, global_batch=16)
    zero = {s: paralab.run(s, 4, steps=2, bucket_mb=0.25) for s in ("ddp", "zero1", "zero2", "zero3")}
    return {
        "timeline_ddp": viz.timeline(ddp, steps=[2],
                                     title="ddp on 2 ranks: bucket all-reduces overlap backward"),
        "timeline_pp": viz.timeline(pp, predicted=predict_run_trace(pp.config), steps=[1],
                                    predicted_steps=[1],
                                    title="1F1B, 4 stages, 8 microbatches: measured (top) and simulated"),
        "bubbles": viz.bubble_vs_microbatches(stages=4),
        "memory_zero": viz.memory(zero, title="peak memory per rank by kind: ddp and ZeRO 1/2/3 on 4 ranks"),
        "schedule_zbv": viz.timeline(simulate_schedule(build_schedule("zbv", 4, 8, 2), ZB_TIMES),
                                     title="zero-bubble V schedule, 4 ranks, 8 microbatches (simulated)"),
    }


def main() -> None:
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page(viewport={"width": 1100, "height": 520})
        for name, fig in figures().items():
            fig.update_layout(width=1100, height=520)
            html = Path(tmp) / f"{name}.html"
            fig.write_html(html, include_plotlyjs=True, full_html=True)
            page.goto(html.as_uri())
            page.wait_for_selector(".js-plotly-plot")
            page.wait_for_timeout(500)
            page.locator(".js-plotly-plot").first.screenshot(path=str(HERE / f"{name}.png"))
            print("wrote", HERE / f"{name}.png")
        browser.close()


if __name__ == "__main__":
    main()
