"""``make test-browser``: notebook 03's slider lab moved in a real browser, JupyterLab driven by Chromium.

JupyterLab runs from this environment (``python -m jupyter lab``) on a free local port with a random token,
``COURSE_PROFILE=ci``, ``HF_HUB_OFFLINE=1``, ``GSM8K_DIR`` passed through, and on a temporary copy of the
notebooks (outputs, settings and workspaces in the same temporary folder: the checkout is never written to,
except the screenshots in ``build/browser/``). Playwright drives Debian's Chromium (``/usr/bin/chromium``,
headless; no browser is downloaded):

1. ``solutions/03_reward_functions.ipynb``: Run > Run All Cells, no cell may fail; then the reward lab of
   section 13 (``RewardLab``: five weight sliders, the preset dropdown, the lenient/strict toggle) is moved the
   way a learner moves it: keys on a slider handle (Home, End, PageUp), a value typed into a readout, a click
   on a slider's track, the dropdown, the toggle. After each move the rendered table must follow the weights:
   every total is the weighted sum of its row's rewards, a row's total moves by (change of weight) x (its
   reward), the advantages are the group-normalised totals, the best total is ``max_total_reward`` of the
   weights, the readouts and the config line show the weights, and both plots' PNG bytes change. Back at the
   "initial" preset and the strict stage, the table is the first one again.
2. ``notebooks/04_train_grpo.ipynb`` (the learner copy): Run > Run All Above Selected Cell up to the profile
   cell; none of those cells may show an error, the kernel must see the ``ci`` profile and read the weights
   notebook 03 saved (``lab.save()``).
3. One page of the rendered course (``rendered/04_train_grpo.ipynb`` as HTML, ``scripts/render_course.py
   --site-only``), opened from disk: it carries its "Rendered on" line and every figure on it is drawn.

Prints ``name: value`` lines, writes screenshots to ``build/browser/``, exits 1 with the reason on any
failure, and always shuts JupyterLab (and its kernels) down.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import http.client
import json
import os
import re
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from playwright.sync_api import Browser, Locator, Page, Playwright, sync_playwright
from playwright.sync_api import Error as PlaywrightError

from course_utils.lesson.rewards import DEFAULT_WEIGHTS, REWARD_NAMES, TOTAL_COLUMN, max_total_reward
from course_utils.lesson.widgets import SLIDER_MAX, SLIDER_STEP

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOTS = ROOT / "build" / "browser"
LAB_NOTEBOOK = ROOT / "solutions" / "03_reward_functions.ipynb"
TRAIN_NOTEBOOK = ROOT / "notebooks" / "04_train_grpo.ipynb"
TRAIN_LAST_CELL = "profile = get_profile()"  # notebook 04's imports-and-profile cell: run everything up to it

SERVER_START_S = 120.0
KERNEL_READY_S = 180.0
RUN_ALL_S = 900.0
MOVE_S = 120.0
POLL_S = 0.25
VIEWPORT = {"width": 1500, "height": 1900}  # tall enough for the whole lab widget in one screenshot

SLIDER_NAMES = tuple(name.removesuffix("_reward_func") for name in REWARD_NAMES)
ADVANTAGE_COLUMN = "advantage"
PLOT_NAMES = ("totals", "advantages")  # LabView's two Image widgets, left to right
STD_EPS = 1e-4  # TRL's epsilon in (r - mean) / (std + eps)

# Which lab widget holds what: the text each HTML widget of LabView starts its content with
CONFIG_MARK = "reward_weights="
VERDICT_MARK = "frac_reward_zero_std"


class BrowserTestError(AssertionError):
    """A check of the browser test failed: the message says which and what was seen."""


# --- JupyterLab -------------------------------------------------------------------------------------------


@dataclass
class Server:
    """A running JupyterLab: its base URL, token, process and log."""

    url: str
    token: str
    process: subprocess.Popen[bytes]
    log: Path
    children: dict[int, psutil.Process] = field(default_factory=dict)  # its kernels seen while it ran

    def api(self, path: str, method: str = "GET") -> Any:
        """Call the server's REST API; the decoded JSON answer (None when empty)."""
        request = urllib.request.Request(
            f"{self.url}{path}", method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            body = answer.read()
        return json.loads(body) if body else None

    def page_url(self, workspace: str, notebook: str) -> str:
        """The URL opening ``notebook`` alone in its own workspace (no state from another page)."""
        return f"{self.url}/lab/workspaces/{workspace}/tree/{notebook}?reset&token={self.token}"


def free_port() -> int:
    """A TCP port nothing listens on now: the one the system picks when binding port 0."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def copy_notebook(source: Path, folder: Path) -> Path:
    """Copy ``source`` into ``folder`` with its outputs and execution counts cleared; the copy's path."""
    notebook = json.loads(source.read_text(encoding="utf-8"))
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / source.name
    target.write_text(json.dumps(notebook, indent=1), encoding="utf-8")
    return target


def write_lab_settings(settings_dir: Path) -> None:
    """User settings for this run only: no news or update toast over the notebook (nothing is fetched)."""
    notification = settings_dir / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    notification.parent.mkdir(parents=True, exist_ok=True)
    notification.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))


def lab_command(port: int, token: str, workdir: Path) -> list[str]:
    """``python -m jupyter lab`` serving ``workdir/notebooks``, its settings and workspaces under ``workdir``."""
    command = [
        sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}", "--ServerApp.port_retries=0",
        "--ServerApp.ip=127.0.0.1", f"--ServerApp.token={token}", f"--notebook-dir={workdir / 'notebooks'}",
        f"--LabApp.user_settings_dir={workdir / 'settings'}", f"--LabApp.workspaces_dir={workdir / 'workspaces'}",
    ]  # fmt: skip
    if os.getuid() == 0:
        command.append("--allow-root")
    return command


def lab_environment(workdir: Path) -> dict[str, str]:
    """The server's (and so the kernels') environment: the ``ci`` profile, offline, outputs in ``workdir``."""
    return {
        **os.environ,
        "COURSE_PROFILE": "ci",
        "HF_HUB_OFFLINE": "1",
        "COURSE_OUTPUT_DIR": str(workdir / "outputs"),
        "PYTHONUNBUFFERED": "1",
    }


def log_tail(log: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file, for a failure message."""
    text = log.read_text(errors="replace") if log.is_file() else ""
    return "\n".join(text.splitlines()[-lines:])


def wait_for_server(server: Server, timeout_s: float = SERVER_START_S) -> None:
    """Poll ``/api/status`` until the server answers; fail early if its process exits."""
    deadline = time.monotonic() + timeout_s
    while True:
        if server.process.poll() is not None:
            raise BrowserTestError(
                f"JupyterLab exited with code {server.process.returncode} before answering:\n{log_tail(server.log)}"
            )
        try:
            server.api("/api/status")
            return
        except (OSError, http.client.HTTPException):  # not listening yet (URLError is an OSError)
            pass
        if time.monotonic() > deadline:
            raise BrowserTestError(f"JupyterLab did not answer within {timeout_s:.0f} s:\n{log_tail(server.log)}")
        time.sleep(POLL_S)


def remember_children(server: Server) -> None:
    """Note the server's child processes (its kernels), so that ``stop_server`` can end any it leaves behind."""
    with suppress(psutil.Error):
        server.children.update({p.pid: p for p in psutil.Process(server.process.pid).children(recursive=True)})


def shutdown_kernels(server: Server) -> None:
    """Shut every running kernel down through the REST API (one notebook's kernel idle beside the next)."""
    remember_children(server)
    for kernel in server.api("/api/kernels") or []:
        server.api(f"/api/kernels/{kernel['id']}", method="DELETE")


def end_process(process: psutil.Process, timeout_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL, one process this test started (a kernel the server did not end).

    psutil checks the process is still the one seen (not a new one given the same pid) before signalling it.
    """
    try:
        process.terminate()
        process.wait(timeout=timeout_s)
    except psutil.TimeoutExpired:
        process.kill()
    except psutil.Error:
        pass


def signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    """Signal the server's process group (it leads its own session: ``start_new_session``)."""
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signum)


def stop_server(server: Server) -> None:
    """Shut JupyterLab down: ``/api/shutdown`` (ends its kernels), else SIGTERM, then SIGKILL; then leftovers."""
    remember_children(server)
    if server.process.poll() is None:
        try:
            server.api("/api/shutdown", method="POST")
            server.process.wait(timeout=30)
        except (OSError, http.client.HTTPException, subprocess.TimeoutExpired):
            signal_group(server.process, signal.SIGTERM)
            try:
                server.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                signal_group(server.process, signal.SIGKILL)
                server.process.wait()
    for process in server.children.values():
        end_process(process)
    print(f"jupyterlab: stopped (exit code {server.process.returncode})")


@contextmanager
def jupyterlab(workdir: Path, log: Path) -> Iterator[Server]:
    """A JupyterLab serving ``workdir/notebooks`` for the duration of the block, always shut down after it."""
    write_lab_settings(workdir / "settings")
    port, token = free_port(), secrets.token_hex(24)
    started = time.monotonic()
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            lab_command(port, token, workdir), cwd=workdir, env=lab_environment(workdir),
            stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    server = Server(f"http://127.0.0.1:{port}", token, process, log)
    try:
        wait_for_server(server)
        print(f"jupyterlab: {server.url} (log {log.relative_to(ROOT) if log.is_relative_to(ROOT) else log})")
        print(f"jupyterlab_start_s: {time.monotonic() - started:.1f}")
        yield server
    finally:
        stop_server(server)


# --- The browser and the notebook ----------------------------------------------------------------------


def launch_browser(playwright: Playwright) -> Browser:
    """Debian's Chromium, headless, through Playwright (no browser of Playwright's own)."""
    if not CHROMIUM.exists():
        raise BrowserTestError(f"{CHROMIUM} is missing: `make test-browser` installs Debian's chromium package")
    return playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)


def new_page(browser: Browser, console_errors: list[str]) -> Page:
    """A page with a tall viewport; the browser's errors are collected in ``console_errors``."""
    page = browser.new_page(viewport=VIEWPORT)
    page.set_default_timeout(60_000)
    page.on("pageerror", lambda error: console_errors.append(f"page error: {error}"))
    page.on("console", lambda message: message.type == "error" and console_errors.append(message.text))
    return page


def open_notebook(page: Page, server: Server, notebook: Path, workspace: str) -> None:
    """Open ``notebook`` in JupyterLab and wait until its cells are shown and its kernel is idle."""
    started = time.monotonic()
    page.goto(server.page_url(workspace, notebook.name))
    page.locator(".jp-NotebookPanel .jp-Cell").first.wait_for(timeout=KERNEL_READY_S * 1000)
    wait_kernel_started(page, server, notebook.name, KERNEL_READY_S)
    wait_kernel_idle(page, KERNEL_READY_S)
    print(f"{workspace}_kernel_ready_s: {time.monotonic() - started:.1f}")


def wait_kernel_started(page: Page, server: Server, notebook: str, timeout_s: float) -> None:
    """Wait until the server runs an idle kernel for ``notebook`` and the status bar shows it idle.

    Before that the toolbar's indicator already reads idle, but a cell run then asks for a kernel in a dialog.
    """
    deadline = time.monotonic() + timeout_s
    while not any(
        s["path"].endswith(notebook) and (s.get("kernel") or {}).get("execution_state") == "idle"
        for s in server.api("/api/sessions") or []
    ):
        if time.monotonic() > deadline:
            raise BrowserTestError(f"no idle kernel for {notebook} within {timeout_s:.0f} s: {log_tail(server.log)}")
        page.wait_for_timeout(POLL_S * 1000)
    page.wait_for_function(
        """() => [...document.querySelectorAll(".jp-StatusBar-TextItem")].some(
            (item) => /\\|\\s*Idle\\s*$/.test(item.textContent.trim()))""",
        timeout=timeout_s * 1000,
    )


def wait_kernel_idle(page: Page, timeout_s: float) -> None:
    """Wait until the notebook toolbar's kernel indicator reads idle (kernel started, nothing running)."""
    page.wait_for_function(
        """() => {
            const marks = [...document.querySelectorAll(".jp-NotebookPanel .jp-Notebook-ExecutionIndicator")];
            return marks.length > 0 && marks.every((mark) => mark.dataset.status === "idle");
        }""",
        timeout=timeout_s * 1000,
    )


def run_menu_item(page: Page, menu: str, item: str) -> None:
    """Click a JupyterLab menu (``Run``, ``File``...), then its item labelled ``item`` (a regular expression)."""
    page.locator(".lm-MenuBar-item", has_text=re.compile(rf"^{re.escape(menu)}$")).click()
    label = page.locator(".lm-Menu-itemLabel", has_text=re.compile(rf"^{item}$"))
    page.locator(".lm-Menu-content > .lm-Menu-item").filter(has=label).click()


def wait_cells_done(page: Page, count: int | None, timeout_s: float) -> None:
    """Wait until no code cell (of the first ``count`` cells; all when None) is queued or running, one has run."""
    page.wait_for_function(
        """(count) => {
            let cells = [...document.querySelectorAll(".jp-NotebookPanel .jp-Notebook .jp-Cell")];
            if (count !== null) cells = cells.slice(0, count);
            const prompts = cells.filter((cell) => cell.classList.contains("jp-CodeCell"))
                .map((cell) => cell.querySelector(".jp-InputPrompt")?.textContent ?? "");
            const done = prompts.some((p) => /\\[\\d+\\]/.test(p)) && !prompts.some((p) => p.includes("*"));
            return done || document.querySelector(".jp-Dialog") !== null;
        }""",
        arg=count,
        timeout=timeout_s * 1000,
    )
    dialog = page.locator(".jp-Dialog")
    if dialog.count():
        raise BrowserTestError(f"a dialog stopped the run: {' '.join(dialog.first.inner_text().split())}")


def save_notebook(page: Page, path: Path, timeout_s: float = 60.0) -> dict[str, Any]:
    """File > Save Notebook, wait until the file on disk changes and parses, and return it as JSON.

    The server writes the file in place, so a read can land between the truncation and the last byte:
    the file counts as saved once it has changed and reads as complete JSON.
    """
    before = path.stat().st_mtime_ns
    run_menu_item(page, "File", "Save( Notebook)?")
    deadline = time.monotonic() + timeout_s
    while True:
        if path.stat().st_mtime_ns != before:
            try:
                return json.loads(path.read_text(encoding="utf-8"))
            except json.JSONDecodeError:
                pass
        if time.monotonic() > deadline:
            raise BrowserTestError(f"File > Save did not write a complete {path.name} within {timeout_s:.0f} s")
        page.wait_for_timeout(POLL_S * 1000)


def output_text(output: dict[str, Any]) -> str:
    """The text of one saved output (stream text, or a rich output's text/plain)."""
    text = output.get("text") or output.get("data", {}).get("text/plain", "")
    return "".join(text) if isinstance(text, list) else str(text)


def notebook_failures(notebook: dict[str, Any], count: int | None = None) -> list[str]:
    """What went wrong in the first ``count`` cells of a saved notebook: cells not run, errors, tracebacks."""
    failures = []
    for index, cell in enumerate(notebook["cells"][:count]):
        if cell["cell_type"] != "code":
            continue
        first_line = ("".join(cell["source"]).strip().splitlines() or [""])[0][:70]
        if cell.get("execution_count") is None:
            failures.append(f"cell {index} did not run: {first_line}")
        for output in cell.get("outputs", []):
            if output["output_type"] == "error":
                failures.append(f"cell {index} raised {output['ename']}: {output['evalue'][:300]} ({first_line})")
            elif output["output_type"] == "stream" and "Traceback (most recent call last)" in output_text(output):
                failures.append(f"cell {index} printed a traceback: {output_text(output)[-300:]} ({first_line})")
    return failures


def cell_output(notebook: dict[str, Any], index: int) -> str:
    """All the text one saved cell printed or displayed."""
    return "\n".join(output_text(o) for o in notebook["cells"][index].get("outputs", []))


# --- The reward lab's state, as rendered -------------------------------------------------------------------

READ_LAB = """async (root) => {
    const text = (el) => (el ? el.textContent.trim() : "");
    const htmls = [...root.querySelectorAll(".widget-html-content")];
    const config = htmls.find((h) => h.textContent.includes(CONFIG_MARK));
    const verdict = htmls.find((h) => h.textContent.includes(VERDICT_MARK));
    const table = root.querySelector(".widget-html-content table");
    const select = root.querySelector(".widget-dropdown select");
    const state = {
        config: text(config),
        verdict: text(verdict),
        headers: table ? [...table.querySelectorAll("thead th")].map(text) : [],
        rows: table
            ? [...table.querySelectorAll("tbody tr")].map((tr) => [...tr.querySelectorAll("td")].map(text))
            : [],
        sliders: [...root.querySelectorAll(".widget-hslider")].map(
            (s) => [text(s.querySelector(".widget-label")), text(s.querySelector(".widget-readout"))]),
        preset: select && select.selectedIndex >= 0 ? text(select.options[select.selectedIndex]) : "",
        stage: text(root.querySelector(".widget-toggle-button.mod-active")),
        plots: [],
    };
    for (const img of root.querySelectorAll("img.widget-image")) {
        const src = img.getAttribute("src");
        try {
            const bytes = new Uint8Array(await (await fetch(src)).arrayBuffer());
            let binary = "";
            for (let i = 0; i < bytes.length; i += 0x8000) {
                binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
            }
            state.plots.push(btoa(binary));
        } catch (error) {
            state.plots.push("");  // its blob was just replaced by the next image: read again
        }
    }
    return state;
}""".replace("CONFIG_MARK", json.dumps(CONFIG_MARK)).replace("VERDICT_MARK", json.dumps(VERDICT_MARK))


@dataclass(frozen=True)
class LabState:
    """What the lab shows at one moment: the weights in its config line, its table, controls and plots."""

    weights: tuple[float, ...]
    best_total: float
    verdict: str
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    slider_labels: tuple[str, ...]
    readouts: tuple[float, ...]
    preset: str
    stage: str
    plots: tuple[str, ...]  # sha256 of each plot's PNG bytes: totals, advantages

    def column(self, name: str) -> list[float]:
        """One numeric column of the table, by its header."""
        index = self.headers.index(name)
        return [float(row[index]) for row in self.rows]

    @property
    def labels(self) -> list[str]:
        return [row[0] for row in self.rows]

    @property
    def totals(self) -> list[float]:
        return self.column(TOTAL_COLUMN)

    def summary(self) -> str:
        """A short description for progress lines and failure messages."""
        totals = ", ".join(f"{t:g}" for t in self.totals) if self.rows else "no table"
        return (
            f"weights {list(self.weights)}, preset {self.preset!r}, stage {self.stage!r}, "
            f"best total {self.best_total:g}, totals [{totals}]"
        )


def parse_number(text: str) -> float:
    """A float from rendered text; NaN when it is not one."""
    try:
        return float(text)
    except ValueError:
        return float("nan")


def parse_lab_state(raw: dict[str, Any]) -> LabState | None:
    """``LabState`` from what ``READ_LAB`` read; None while the lab is not fully rendered."""
    weights = re.search(r"reward_weights=\[([^\]]*)\]", raw["config"])
    best = re.search(r"best total ([-+.\deE]+)", raw["config"])
    if not (weights and best and raw["rows"] and len(raw["plots"]) == 2 and all(raw["plots"])):
        return None
    return LabState(
        weights=tuple(float(w) for w in weights.group(1).split(",")),
        best_total=float(best.group(1)),
        verdict=raw["verdict"],
        headers=tuple(raw["headers"]),
        rows=tuple(tuple(row) for row in raw["rows"]),
        slider_labels=tuple(label for label, _ in raw["sliders"]),
        readouts=tuple(parse_number(readout) for _, readout in raw["sliders"]),
        preset=raw["preset"],
        stage=raw["stage"],
        plots=tuple(hashlib.sha256(base64.b64decode(p)).hexdigest() for p in raw["plots"]),
    )


def read_lab(lab: Locator) -> LabState | None:
    """The lab's state as rendered now (None while incomplete)."""
    return parse_lab_state(lab.evaluate(READ_LAB))


def wait_for_lab(page: Page, lab: Locator, ready: Callable[[LabState], bool], what: str) -> LabState:
    """Poll the rendered lab until ``ready`` holds and the kernel is idle again; that state.

    ``ready`` describes the final state of one move (weights, stage, new plots), so a state half redrawn (the
    table new, the plots not yet) does not pass; the idle kernel then says no redraw is still on its way.
    """
    deadline = time.monotonic() + MOVE_S
    last = None
    while time.monotonic() < deadline:
        state = read_lab(lab)
        last = state or last
        if state is not None and ready(state):
            wait_kernel_idle(page, MOVE_S)
            final = read_lab(lab)
            if final is not None and ready(final):
                return final
        page.wait_for_timeout(POLL_S * 1000)
    seen = last.summary() if last else "the lab never rendered completely"
    raise BrowserTestError(f"{what}: the lab did not show it within {MOVE_S:.0f} s; it shows {seen}")


# --- What the rendered lab must satisfy ----------------------------------------------------------------------


def close(a: float, b: float, tol: float) -> bool:
    """``|a - b| <= tol``."""
    return abs(a - b) <= tol


def check(condition: bool, message: str) -> None:
    """Raise ``BrowserTestError(message)`` unless ``condition``."""
    if not condition:
        raise BrowserTestError(message)


def check_consistent(state: LabState, what: str) -> None:
    """The table, readouts and best total agree with the weights the lab shows.

    Every total is the weighted sum of its row's rewards (within the table's rounding to 3 decimals), the
    advantages are the totals normalised in the group ((r - mean) / (sample std + 1e-4), as TRL does), the best
    total is ``max_total_reward`` of the weights and each slider's readout shows its weight.
    """
    expected_headers = ("label", *REWARD_NAMES, TOTAL_COLUMN, ADVANTAGE_COLUMN)
    check(state.headers == expected_headers, f"{what}: table columns {state.headers}, expected {expected_headers}")
    check(state.slider_labels == SLIDER_NAMES, f"{what}: sliders {state.slider_labels}, expected {SLIDER_NAMES}")
    weights = state.weights
    tol = 0.0005 * (1 + sum(abs(w) for w in weights)) + 1e-9
    columns = [state.column(name) for name in REWARD_NAMES]
    for row, label in enumerate(state.labels):
        weighted = sum(w * column[row] for w, column in zip(weights, columns, strict=True))
        check(
            close(state.totals[row], weighted, tol),
            f"{what}: row {label!r} shows total {state.totals[row]}, but its rewards x the weights {list(weights)} "
            f"make {weighted:.4f}",
        )
    totals, advantages = state.totals, state.column(ADVANTAGE_COLUMN)
    mean, std = statistics.fmean(totals), statistics.stdev(totals)
    for label, total, advantage in zip(state.labels, totals, advantages, strict=True):
        expected = (total - mean) / (std + STD_EPS) if std > 0 else 0.0
        check(
            close(advantage, expected, 0.01),
            f"{what}: row {label!r} shows advantage {advantage}, (total - mean) / std of the shown totals is "
            f"{expected:.3f}",
        )
    check(
        close(state.best_total, max_total_reward(weights), 1e-3),
        f"{what}: best total {state.best_total}, max_total_reward({list(weights)}) = {max_total_reward(weights):g}",
    )
    for name, readout, weight in zip(SLIDER_NAMES, state.readouts, weights, strict=True):
        check(close(readout, weight, 0.006), f"{what}: slider {name!r} reads {readout}, its weight is {weight}")


def check_move(before: LabState, after: LabState, what: str, stage_changed: bool = False) -> str:
    """After one move: consistent, the table and both plots changed; without a stage change, each row's
    total moved by exactly the weight changes times its own rewards. A progress line saying what changed."""
    check_consistent(after, what)
    check(after.labels == before.labels, f"{what}: the table's rows changed: {after.labels}")
    check(after.rows != before.rows, f"{what}: the table did not change")
    check(after.plots[0] != before.plots[0], f"{what}: the totals plot did not change")
    check(after.plots[1] != before.plots[1], f"{what}: the advantages plot did not change")
    if not stage_changed:
        for name in REWARD_NAMES:
            check(
                after.column(name) == before.column(name),
                f"{what}: column {name} changed although only the weights moved",
            )
        tol = 0.0005 * (2 + sum(abs(w) for w in after.weights + before.weights))
        for row, label in enumerate(after.labels):
            shift = sum(
                (new - old) * before.column(name)[row]
                for name, new, old in zip(REWARD_NAMES, after.weights, before.weights, strict=True)
            )
            check(
                close(after.totals[row] - before.totals[row], shift, tol),
                f"{what}: row {label!r} total went {before.totals[row]} -> {after.totals[row]}, the weight change "
                f"implies a change of {shift:+.4f}",
            )
    changed = [i for i, (a, b) in enumerate(zip(before.totals, after.totals, strict=True)) if a != b]
    check(bool(changed), f"{what}: no total changed")
    row = changed[0]
    return (
        f"{after.labels[row]!r} total {before.totals[row]:g} -> {after.totals[row]:g}, best total "
        f"{before.best_total:g} -> {after.best_total:g}, table and both plots changed"
    )


def same_weights(a: Sequence[float], b: Sequence[float]) -> bool:
    """Equal weights, up to float noise from the slider's steps."""
    return len(a) == len(b) and all(close(x, y, 1e-6) for x, y in zip(a, b, strict=True))


def replaced(weights: Sequence[float], index: int, value: float) -> tuple[float, ...]:
    """``weights`` with the one at ``index`` set to ``value``."""
    return tuple(value if i == index else w for i, w in enumerate(weights))


# --- The moves -----------------------------------------------------------------------------------------


def slider(lab: Locator, name: str) -> Locator:
    """The FloatSlider whose description is ``name`` (a reward's short name)."""
    label = lab.page.locator(".widget-label", has_text=re.compile(rf"^\s*{re.escape(name)}\s*$"))
    return lab.locator(".widget-hslider").filter(has=label)


def press_on_handle(lab: Locator, name: str, key: str) -> None:
    """Focus a slider's handle and press ``key`` (noUiSlider: arrows one step, PageUp/Down 5, Home/End)."""
    slider(lab, name).locator(".noUi-handle").press(key)


def type_in_readout(lab: Locator, name: str, value: str) -> None:
    """Type ``value`` into a slider's readout (the editable number beside it) and press Enter."""
    readout = slider(lab, name).locator(".widget-readout")
    readout.click()
    readout.fill(value)
    readout.press("Enter")


def click_on_track(lab: Locator, name: str, fraction: float) -> None:
    """Click a slider's track at ``fraction`` of its length: the handle jumps there."""
    track = slider(lab, name).locator(".noUi-target")
    box = track.bounding_box()
    if box is None:
        raise BrowserTestError(f"the {name} slider's track is not visible")
    track.click(position={"x": box["width"] * fraction, "y": box["height"] / 2})


@dataclass
class LabRun:
    """The lab being moved: page, widget, the state now, and where screenshots go."""

    page: Page
    lab: Locator
    state: LabState
    shots: Path
    moves: int = 0
    timings: list[float] = field(default_factory=list)

    def move(
        self,
        what: str,
        action: Callable[[], None],
        ready: Callable[[LabState], bool],
        stage_changed: bool = False,
    ) -> LabState:
        """Do one move, wait for its final redraw, check it, screenshot it, print what changed."""
        before = self.state
        started = time.monotonic()
        action()

        def redrawn(state: LabState) -> bool:  # the move's final state, with both plots drawn anew
            return ready(state) and state.plots[0] != before.plots[0] and state.plots[1] != before.plots[1]

        after = wait_for_lab(self.page, self.lab, redrawn, what)
        seconds = time.monotonic() - started
        change = check_move(before, after, what, stage_changed)
        self.moves += 1
        self.timings.append(seconds)
        slug = re.sub(r"[^a-z0-9]+", "_", what.lower()).strip("_")[:40]
        self.lab.screenshot(path=self.shots / f"03_{self.moves}_{slug}.png")
        print(f"move {self.moves} ({what}): {change} [{seconds:.2f} s]")
        self.state = after
        return after


def move_slider(run: LabRun, index: int, how: str, action: Callable[[], None], value: float | None) -> LabState:
    """Move slider ``index`` by ``action``: its weight becomes ``value`` (None: any other value), the others stay,
    and the preset dropdown says "custom"."""
    before = run.state.weights

    def ready(state: LabState) -> bool:
        others = same_weights(replaced(state.weights, index, 0.0), replaced(before, index, 0.0))
        if value is None:
            moved = not close(state.weights[index], before[index], 1e-9)
        else:
            moved = close(state.weights[index], value, 1e-6)
        return others and moved and state.preset == "custom"

    return run.move(f"{SLIDER_NAMES[index]} {how}", action, ready)


def move_sliders(run: LabRun) -> None:
    """Move each of the five weight sliders once, each a different way a learner would."""
    lab, names, start = run.lab, SLIDER_NAMES, run.state.weights
    move_slider(run, 0, "to 0 with the Home key", lambda: press_on_handle(lab, names[0], "Home"), 0.0)
    move_slider(
        run, 1, f"to {SLIDER_MAX:g} with the End key", lambda: press_on_handle(lab, names[1], "End"), SLIDER_MAX
    )
    move_slider(
        run, 2, "up 5 steps with PageUp", lambda: press_on_handle(lab, names[2], "PageUp"), start[2] + 5 * SLIDER_STEP
    )
    move_slider(run, 3, "to 2.5 typed in its readout", lambda: type_in_readout(lab, names[3], "2.5"), 2.5)
    after = move_slider(run, 4, "by a click at 80% of its track", lambda: click_on_track(lab, names[4], 0.8), None)
    check(
        close(after.weights[4], 0.8 * SLIDER_MAX, 0.1 * SLIDER_MAX),
        f"a click at 80% of the {names[4]} track set {after.weights[4]}, expected about {0.8 * SLIDER_MAX:g}",
    )


def set_preset(run: LabRun, preset: str) -> LabState:
    """Choose ``preset`` in the dropdown: every slider and the table follow."""
    weights = tuple(DEFAULT_WEIGHTS[preset])
    return run.move(
        f"preset {preset}",
        lambda: run.lab.locator(".widget-dropdown select").select_option(label=preset),
        lambda s: same_weights(s.weights, weights) and s.preset == preset,
    )


def set_stage(run: LabRun, stage: str) -> LabState:
    """Click ``stage`` on the format toggle; the strict-format column is rescored, the weights stay."""
    before = run.state
    after = run.move(
        f"format {stage}",
        lambda: run.lab.locator(".widget-toggle-button", has_text=re.compile(rf"^\s*{stage}\s*$")).click(),
        lambda s: s.stage == stage and same_weights(s.weights, before.weights),
        stage_changed=True,
    )
    strict = REWARD_NAMES[2]
    check(after.column(strict) != before.column(strict), f"format {stage}: the {strict} column did not change")
    others = [name for name in REWARD_NAMES if name != strict]
    check(
        all(after.column(n) == before.column(n) for n in others),
        f"format {stage}: a column other than {strict} changed",
    )
    return after


def report_plot_visibility(lab: Locator) -> None:
    """Print how many pixels of each plot's width the output area shows (a warning line when one is cut off)."""
    widths = lab.evaluate(
        """(root) => {
            const area = root.getBoundingClientRect();
            return [...root.querySelectorAll("img.widget-image")].map((img) => {
                const box = img.getBoundingClientRect();
                const visible = Math.max(0, Math.min(box.right, area.right) - Math.max(box.left, area.left));
                return [Math.round(visible), img.naturalWidth];
            });
        }"""
    )
    shown = ", ".join(
        f"{name} {visible} of {natural}" for name, (visible, natural) in zip(PLOT_NAMES, widths, strict=True)
    )
    print(f"lab_plot_width_px: {shown} (viewport {VIEWPORT['width']} px wide)")
    if any(visible < natural for visible, natural in widths):
        print("warning: a plot of the lab is wider than the notebook's output area and is cut off")


def check_reward_lab(page: Page, server: Server, notebook: Path, shots: Path) -> None:
    """Notebook 03: run all cells (none may fail), then move the slider lab and check every redraw."""
    open_notebook(page, server, notebook, "nb03")
    started = time.monotonic()
    run_menu_item(page, "Run", "Run All Cells")
    wait_cells_done(page, None, RUN_ALL_S)
    print(f"nb03_run_all_s: {time.monotonic() - started:.1f}")
    saved = save_notebook(page, notebook)
    failures = notebook_failures(saved)
    check(not failures, "notebook 03 (solutions) did not run cleanly:\n  " + "\n  ".join(failures))
    code_cells = sum(c["cell_type"] == "code" for c in saved["cells"])
    print(f"nb03_cells_run: {code_cells} of {code_cells}, no error")

    lab = page.locator(".jp-OutputArea-output:has(.widget-dropdown select):has(.widget-toggle-buttons)")
    lab.first.wait_for(timeout=MOVE_S * 1000)
    check(lab.count() == 1, f"expected one reward lab in notebook 03's outputs, found {lab.count()}")
    lab.scroll_into_view_if_needed()
    for index in range(2):
        lab.locator("img.widget-image").nth(index).wait_for()
    check(page.get_by_text("Error displaying widget").count() == 0, "a widget failed to display ('Error displaying')")
    initial_weights = tuple(DEFAULT_WEIGHTS["initial"])
    initial = wait_for_lab(
        page,
        lab,
        lambda s: same_weights(s.weights, initial_weights) and s.preset == "initial" and s.stage == "strict",
        "the lab as first drawn (preset initial, format strict)",
    )
    check_consistent(initial, "the lab as first drawn")
    rendered = lab.evaluate("(root) => [...root.querySelectorAll('img.widget-image')].map((i) => i.naturalWidth)")
    check(all(width > 0 for width in rendered), f"a plot image did not render (widths {rendered})")
    lab.screenshot(path=shots / "03_0_initial.png")
    report_plot_visibility(lab)
    print(f"lab_initial: {initial.summary()}")
    print(f"lab_verdict: {initial.verdict}")

    run = LabRun(page, lab, initial, shots)
    move_sliders(run)
    set_preset(run, "tuned")
    print(f"lab_tuned: {run.state.summary()}")
    set_stage(run, "lenient")
    print(f"lab_verdict_lenient: {run.state.verdict}")
    set_stage(run, "strict")
    final = set_preset(run, "initial")
    check(final.rows == initial.rows, "back at preset initial and format strict, the table differs from the first one")
    print(f"lab_back_to_initial: table as first drawn; plots as first drawn: {final.plots == initial.plots}")
    print(f"lab_moves: {run.moves}")
    print(f"lab_redraw_s: mean {statistics.fmean(run.timings):.2f}, max {max(run.timings):.2f}")
    page.screenshot(path=shots / "03_page.png")


def check_training_cells(page: Page, server: Server, notebook: Path, shots: Path) -> None:
    """Notebook 04 (learner copy): run every cell up to the imports-and-profile cell; no error may show."""
    source = json.loads(notebook.read_text(encoding="utf-8"))
    code = [i for i, c in enumerate(source["cells"]) if c["cell_type"] == "code"]
    last = next((i for i in code if TRAIN_LAST_CELL in "".join(source["cells"][i]["source"])), None)
    check(last is not None, f"{notebook.name}: no code cell contains {TRAIN_LAST_CELL!r}")
    check(last + 1 < len(source["cells"]), f"{notebook.name}: the profile cell is the last cell")
    open_notebook(page, server, notebook, "nb04")
    started = time.monotonic()
    page.locator(".jp-NotebookPanel .jp-Notebook .jp-Cell").nth(last + 1).locator(".jp-InputPrompt").click()
    run_menu_item(page, "Run", "Run All Above Selected Cell")
    wait_cells_done(page, last + 1, KERNEL_READY_S + RUN_ALL_S)
    print(f"nb04_first_cells_s: {time.monotonic() - started:.1f}")
    saved = save_notebook(page, notebook)
    failures = notebook_failures(saved, last + 1)
    check(not failures, "notebook 04's first cells did not run cleanly:\n  " + "\n  ".join(failures))
    cells = page.locator(".jp-NotebookPanel .jp-Notebook .jp-Cell")
    for index in range(last + 1):
        shown = cells.nth(index).locator(".jp-OutputArea").all_text_contents()
        check(not any("Traceback" in text for text in shown), f"notebook 04's cell {index} shows a traceback")
    cells.nth(last).scroll_into_view_if_needed()
    printed = cell_output(saved, last)
    check("Profile 'ci'" in printed, f"notebook 04's profile cell does not say Profile 'ci':\n{printed[:500]}")
    weights_file = Path(lab_environment(notebook.parent.parent)["COURSE_OUTPUT_DIR"]) / "reward_weights.json"
    check(
        f"Reward weights from {weights_file}" in printed,
        f"notebook 04 did not read the weights notebook 03 saved ({weights_file}):\n{printed[:500]}",
    )
    run_cells = sum(c["cell_type"] == "code" for c in saved["cells"][: last + 1])
    print(f"nb04_cells_run: {run_cells} (up to the profile cell), no error")
    print(f"nb04_profile: {next(line for line in printed.splitlines() if 'Profile' in line)}")
    page.screenshot(path=shots / "04_first_cells.png")


# --- main ----------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--screenshots", type=Path, default=SCREENSHOTS, help="folder for the PNGs (and the log)")
    return parser.parse_args(argv)


RENDERED_PAGE = "04_train_grpo"  # the rendered notebook opened: its dashboard and plots are images


def check_rendered_page(page: Page, shots: Path) -> None:
    """One page of the rendered course (``make render``), built to HTML here: its first line and its figures drawn."""
    site = ROOT / "build" / "site"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "render_course.py"), "--site-only"], check=True,
                   capture_output=True)  # fmt: skip
    page.goto((site / f"{RENDERED_PAGE}.html").as_uri())
    page.wait_for_load_state("load")
    check(page.get_by_text("Rendered on").count() > 0, f"{RENDERED_PAGE}.html: no 'Rendered on' line (the machine)")
    widths = page.eval_on_selector_all("img", "images => images.map(image => image.complete ? image.naturalWidth : 0)")
    check(len(widths) > 0, f"{RENDERED_PAGE}.html: no figure on the page")
    check(all(width > 0 for width in widths), f"{RENDERED_PAGE}.html: figures not drawn (widths {widths})")
    page.screenshot(path=shots / f"rendered_{RENDERED_PAGE}.png", full_page=True)
    print(f"rendered_{RENDERED_PAGE}_figures: {len(widths)}, all drawn")


def run_checks(server: Server, shots: Path, workdir: Path, console_errors: list[str]) -> None:
    """Both notebooks in Chromium; a screenshot of the page as it was when a check fails."""
    with sync_playwright() as playwright:
        browser = launch_browser(playwright)
        print(f"chromium: {browser.version}")
        page = new_page(browser, console_errors)
        try:
            check_reward_lab(page, server, workdir / "notebooks" / LAB_NOTEBOOK.name, shots)
            shutdown_kernels(server)
            page.close()
            page = new_page(browser, console_errors)
            check_training_cells(page, server, workdir / "notebooks" / TRAIN_NOTEBOOK.name, shots)
            page.close()
            page = new_page(browser, console_errors)
            check_rendered_page(page, shots)
        except BaseException:
            try:
                page.screenshot(path=shots / "failure.png")
                print(f"screenshot of the failure: {shots / 'failure.png'}", file=sys.stderr)
            except PlaywrightError:
                pass
            raise
        finally:
            browser.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    shots: Path = args.screenshots.resolve()
    shutil.rmtree(shots, ignore_errors=True)
    shots.mkdir(parents=True)
    started = time.monotonic()
    console_errors: list[str] = []
    with tempfile.TemporaryDirectory(prefix="browser-test-") as tmp:
        workdir = Path(tmp)
        for source in (LAB_NOTEBOOK, TRAIN_NOTEBOOK):
            copy_notebook(source, workdir / "notebooks")
        try:
            with jupyterlab(workdir, shots / "jupyterlab.log") as server:
                run_checks(server, shots, workdir, console_errors)
        except (BrowserTestError, PlaywrightError) as error:
            print(f"browser_test: FAILED: {error}", file=sys.stderr)
            print(f"browser_console_errors: {len(console_errors)}", file=sys.stderr)
            for message in console_errors[:10]:
                print(f"  {message[:300]}", file=sys.stderr)
            return 1
    print(f"browser_console_errors: {len(console_errors)}")
    for message in console_errors[:5]:
        print(f"  {message[:300]}")
    print(f"screenshots: {shots.relative_to(ROOT) if shots.is_relative_to(ROOT) else shots}")
    print(f"browser_test_s: {time.monotonic() - started:.1f}")
    print("browser_test: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
