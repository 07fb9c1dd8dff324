"""``report.html`` of a run, and the evaluation table printed in the terminal.

The page is self-contained (inline CSS, PNGs embedded as base64 data URIs) so it can be mailed or
archived alone. Every string that comes from a file (notes, the privacy statement, labels) is
HTML-escaped. The headline follows docs/privacy.md ("Each method's headline ε"): the method's headline ε first
(per client against an untrusted server where it has one), with δ and the accounting rule; the
amplified ε only beside it, labelled as an assumption about the server.

``eval_result`` (``eval.json``) may hold any of ``fid``, ``fid_domain``, ``inception_score``,
``gen2real_acc``, ``real2gen_acc``; each entry is either a bare value (a number, ``[mean, std]`` for
the Inception Score, ``{"cnn", "mlp"}`` accuracies as fractions) or a dict holding the value
(``value``, or ``mean``/``std``, or ``cnn``/``mlp``) and its ``num_samples`` (or ``num_train`` and
``num_test``, as ``utility.gen2real`` returns them). The sample count may also sit at
``<key>_num_samples`` or in a top-level ``num_samples`` (a number or a dict by key).
Missing keys are left out; None reads "n/a". Other top-level keys are listed as they are.
"""

from __future__ import annotations

import base64
import json
import os
import statistics
import threading
from pathlib import Path
from typing import Any

from PIL import Image

from common.evaluation.beside import epsilon_captions, headline_kind
from common.evaluation.plots import client_epsilons, finite_or_none, format_bytes
from common.evaluation.quality import classifier_scores, quality_warnings
from common.evaluation.report_audit import audit_rows, read_audit, read_json
from common.evaluation.report_text import escape as _e
from common.evaluation.report_text import number as _num
from common.evaluation.report_text import wall_text

REPORT = "report.html"
EVAL_ROWS = (  # key, label, kind of value
    ("fid", "FID (Inception pool3, lower is better)", "number"),
    ("fid_domain", "domain FID (project classifier features, lower is better)", "number"),
    ("inception_score", "Inception Score (classifier trained on real data, higher is better)", "mean_std"),
    ("gen2real_acc", "gen2real accuracy (train on generated, test on real)", "accuracy"),
    ("real2gen_acc", "real2gen accuracy (train on real, test on generated)", "accuracy"),
)
NOT_FIGURES = {
    "num_samples",
    "privacy",
    "curve",
    "steps_completed",
    "step",
    "run_dir",
    "num_classes",
}  # eval.json bookkeeping
CAPTIONS = {  # plot name prefix -> caption (the first two in the run's own terms: beside.epsilon_captions)
    "epsilon_per_client": "ε per client: each client's own answered queries composed, no amplification.",
    "training_curves": "ε (max and median over clients) and the critic's Wasserstein estimate over generator steps.",
    "epsilon_vs_fid": "Quality of the released generator at checkpoints against the ε spent by then "
    "(max over clients).",
    "bytes_per_step": "Serialized message bytes per generator step per participating client, "
    "server → client (down) and client → server (up), log scale.",
    "samples": "Samples of the released (EMA) generator, one row per class.",
    "side_by_side": "Sample grids of two generators side by side, one row per class.",
}
CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em}h2{margin-top:1.6em;border-bottom:1px solid #ddd;padding-bottom:.2em}
.sub{color:#666;margin-top:0}table{border-collapse:collapse;margin:.5em 0}
th,td{text-align:left;vertical-align:top;padding:.3em .8em;border-bottom:1px solid #eee}
th{color:#444;font-weight:600;min-width:9em}td.num{font-variant-numeric:tabular-nums}
.small{font-size:.88em;color:#555}figure{margin:1.5em 0}figure img{max-width:100%;border:1px solid #eee}
img.pixels{image-rendering:pixelated}figcaption{color:#444;font-size:.92em;margin-top:.3em}
.missing{color:#a00}.statement{background:#f7f7f7;padding:.8em 1em;border-left:3px solid #c33}
"""


# --- evaluation figures ----------------------------------------------------------------------------
def _eval_entry(eval_result: dict, key: str) -> tuple[Any, Any]:
    """(value, num_samples) of one evaluation figure, whichever of the accepted shapes it has."""
    raw = eval_result[key]
    samples = None
    if isinstance(raw, dict):
        samples = raw.get("num_samples")
        if samples is None and ("num_train" in raw or "num_test" in raw):  # utility.gen2real/real2gen
            samples = f"train {_format_samples(raw.get('num_train'))} · test {_format_samples(raw.get('num_test'))}"
        raw = raw["value"] if "value" in raw else {k: v for k, v in raw.items() if not k.startswith("num_")}
    if samples is None:
        samples = eval_result.get(f"{key}_num_samples")
    if samples is None:
        top = eval_result.get("num_samples")
        samples = top.get(key) if isinstance(top, dict) else top
    return raw, samples


def _format_value(value: Any, kind: str) -> str:
    if kind == "mean_std":
        if isinstance(value, dict):
            value = [value.get("mean"), value.get("std")]
        if isinstance(value, (list, tuple)):
            mean, std = (list(value) + [None, None])[:2]
            return _num(mean) + ("" if finite_or_none(std) is None else f" ± {_num(std, '.2g')}")
    if kind == "accuracy":
        if isinstance(value, dict):
            return " · ".join(f"{name.upper()} {_percent(v)}" for name, v in classifier_scores(value).items())
        return _percent(value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=str)
    return _num(value) if value is None or finite_or_none(value) is not None else str(value)


def _percent(value: Any) -> str:
    v = finite_or_none(value)
    return "n/a" if v is None else (f"{v:.1%}" if 0.0 <= v <= 1.0 else f"{v:.4g}")


def _format_samples(samples: Any) -> str:
    if isinstance(samples, str):
        return samples
    v = finite_or_none(samples)
    return "n/a" if v is None else f"{v:,.0f}"


def eval_rows(eval_result: dict | None) -> list[tuple[str, str, str]]:
    """(label, value, number of samples) for each figure present, known figures first."""
    eval_result = eval_result or {}
    rows = []
    for key, label, kind in EVAL_ROWS:
        if key in eval_result:
            value, samples = _eval_entry(eval_result, key)
            rows.append((label, _format_value(value, kind), _format_samples(samples)))
    known = {k for k, _, _ in EVAL_ROWS} | NOT_FIGURES
    for key, value in eval_result.items():
        # Other figures a caller added, if they are plain numbers; structures (the privacy block, the
        # ε-vs-quality curve) have their own sections and would only be dumped as JSON here.
        if key not in known and not key.endswith("_num_samples") and isinstance(value, (int, float)):
            rows.append((key, _format_value(value, "other"), ""))
    return rows


def format_eval_table(eval_result: dict | None) -> str:
    """The evaluation figures as a plain-text table for the terminal."""
    rows = eval_rows(eval_result)
    if not rows:
        return "no evaluation results"
    rows = [("evaluation", "value", "samples")] + rows
    w0, w1 = (max(len(r[i]) for r in rows) for i in (0, 1))
    return "\n".join(f"{a.ljust(w0)}  {b.ljust(w1)}  {c}".rstrip() for a, b, c in rows)


# --- run headline ----------------------------------------------------------------------------------
def _epsilon_summary(summary: dict) -> str:
    rows = client_epsilons(summary)
    answered = [eps for _, eps, queries in rows if queries > 0]
    finite = sorted(e for e in answered if e is not None)
    unbounded = len(answered) - len(finite)
    parts = []
    if finite:
        parts.append(f"min {finite[0]:.4g} · median {statistics.median(finite):.4g} · max {finite[-1]:.4g}")
    if unbounded:
        reason = next(
            (
                c.get("epsilon_reason")
                for c in summary.get("clients") or []
                if c.get("queries") and c.get("epsilon") is None and c.get("epsilon_reason")
            ),
            "",
        )
        parts.append(f"unbounded (null) for {unbounded} client(s)" + (f": {reason}" if reason else ""))
    if not answered:
        parts.append("0 (no client answered a query)")
    idle = len(rows) - len(answered)
    return "; ".join(parts) + f"  [over the {len(answered)} clients that answered; {idle} answered none, ε = 0]"


def _amplified(summary: dict) -> str:
    amp = summary.get("epsilon_amplified") or {}
    if not amp:
        return "n/a"
    if amp.get("epsilon") is None and amp.get("epsilon_reason"):
        return f"{amp['epsilon_reason']} — {amp.get('assumption', '')}"
    details = [
        f"q = {_num(amp.get('sample_rate'))}" if "sample_rate" in amp else "",
        f"T = {amp['steps']} steps" if "steps" in amp else "",
        f"noise multiplier {_num(amp.get('query_noise_multiplier'))}" if "query_noise_multiplier" in amp else "",
    ]
    details = ", ".join(d for d in details if d)
    assumption = amp.get("assumption") or "assumes the server samples clients uniformly (trusted sampling)"
    return f"{_num(amp.get('epsilon'))}" + (f" ({details})" if details else "") + f" — {assumption}"


def _duration(seconds: Any) -> str:
    s = finite_or_none(seconds)
    if s is None:
        return "n/a"
    return (
        f"{s:.1f} s" if s < 120 else f"{s:.0f} s ({s / 3600:.2f} h)" if s >= 3600 else f"{s:.0f} s ({s / 60:.1f} min)"
    )


def headline_rows(summary: dict) -> list[tuple[str, str]]:
    """(label, value) rows of the run's headline table."""
    delta = summary.get("delta")
    comm = summary.get("comm") or {}
    per_step = comm.get("bytes_per_step") or {}

    def _bytes(n: Any) -> str:
        v = finite_or_none(n)
        return "n/a" if v is None else f"{v:,.0f} B ({format_bytes(v)})"

    get = summary.get
    mechanism = get("mechanism") or {}
    amp = get("epsilon_amplified") or {}
    accountant = str(get("accountant", "rdp")).upper()
    rows = [
        ("strategy", f"{get('strategy', 'n/a')} ({get('status', 'status unknown')})"),
        ("data · model", f"{get('dataset', 'n/a')}, {get('partition', 'n/a')} partition · {get('model', 'n/a')}"),
        ("generator steps", f"{get('steps_completed', 'n/a')} / {get('steps_planned', 'n/a')}"),
        (
            "clients · mechanism",
            f"K = {get('num_clients', 'n/a')}; "
            + (", ".join(f"{k} = {_num(v)}" for k, v in mechanism.items()) or "n/a"),
        ),
        (
            f"ε {headline_kind(summary)} (δ = {_num(delta, 'g')}, {accountant})",
            _epsilon_summary(summary),
        ),
        ("accounting rule", str(get("accounting", "n/a"))),
        (f"ε {amp.get('kind') or 'amplified, trusted sampling'} (δ = {_num(delta, 'g')})", _amplified(summary)),
        ("bytes / step / client", f"down {_bytes(per_step.get('down'))} · up {_bytes(per_step.get('up'))}"),
        (
            "bytes total",
            f"down {_bytes(comm.get('bytes_down_total'))} · up {_bytes(comm.get('bytes_up_total'))}"
            + (f" · wire dtype {get('wire_dtype')}" if get("wire_dtype") else ""),
        ),
        ("wall time", wall_text(get("wall_s"), get("prior_wall_s"), _duration)),
        ("run directory", str(get("run_dir", "n/a"))),
    ]
    return rows


# --- HTML ------------------------------------------------------------------------------------------
def _table(rows: list[tuple[str, ...]], header: tuple[str, ...] | None = None) -> str:
    head = "<tr>" + "".join(f"<th>{_e(h)}</th>" for h in header) + "</tr>" if header else ""
    body = "".join(
        "<tr><th>" + _e(r[0]) + "</th>" + "".join(f'<td class="num">{_e(c)}</td>' for c in r[1:]) + "</tr>"
        for r in rows
    )
    return f"<table>{head}{body}</table>"


def _clients_table(summary: dict) -> str:
    clients = summary.get("clients") or []
    if not clients:
        return ""
    rows = [
        (
            str(c.get("client_id", i)),
            str(c.get("queries", 0)),
            _num(c.get("epsilon")) if c.get("queries") else "0",
            _num(c.get("epsilon_prv")) if c.get("queries") else "0",
            format_bytes(finite_or_none(c.get("bytes_down"))),
            format_bytes(finite_or_none(c.get("bytes_up"))),
        )
        for i, c in enumerate(clients)
    ]
    header = ("client", "queries", "ε (headline)", "ε (PRV)", "bytes down", "bytes up")
    return (
        f"<details><summary>per-client ledger ({len(clients)} clients; n/a = unbounded)</summary>"
        f"{_table(rows, header)}</details>"
    )


def _figure(name: str, entry: Path | str | tuple[Path | str, str], captions: dict[str, str] = CAPTIONS) -> str:
    path, caption = (
        entry
        if isinstance(entry, tuple)
        else (entry, next((c for k, c in captions.items() if name.startswith(k)), name.replace("_", " ")))
    )
    path = Path(path)
    try:
        data = path.read_bytes()
        with Image.open(path) as img:
            width = img.width
    except (OSError, ValueError) as err:
        return (
            f'<figure><p class="missing">{_e(name)}: image {_e(path)} could not be read '
            f"({_e(type(err).__name__)})</p></figure>"
        )
    # raw sample grids are a few hundred pixels wide: show them twice as large, without blurring
    style = f' class="pixels" width="{2 * width}"' if width < 500 else ""
    uri = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
    return (
        f'<figure id="{_e(name)}"><img src="{uri}" alt="{_e(name)}"{style}>'
        f"<figcaption><b>{_e(name)}</b>: {_e(caption)}</figcaption></figure>"
    )


def _latest_samples(run_dir: Path) -> Path | None:
    grids = sorted((run_dir / "samples").glob("step-*.png"))
    return grids[-1] if grids else None


def render_report(
    summary: dict, eval_result: dict | None, plots: dict[str, Any], *, title: str, audit: dict | None = None
) -> str:
    """The report page as a string (``write_report`` adds the files of the run directory)."""
    ev = eval_rows(eval_result)
    warnings = quality_warnings(eval_result or {}, num_classes=_classes(eval_result))
    notes = summary.get("notes") or []
    parts = [
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
        f"<style>{CSS}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        f'<p class="sub">{_e(summary.get("run_dir", ""))}</p>',
        *(
            [f'<p class="statement"><b>NOT PRIVATE</b>: {_e("; ".join(summary["not_private"]))}</p>']
            if summary.get("not_private")
            else []
        ),
        "<h2>Run</h2>",
        _table(headline_rows(summary)),
        _clients_table(summary),
        "<h2>Evaluation</h2>",
        _table(ev, ("figure", "value", "samples")) if ev else "<p>No evaluation results.</p>",
        *(f'<p class="missing">{_e(w)}</p>' for w in warnings),
        "<h2>Privacy statement</h2>",
        f'<p class="statement">{_e(summary.get("privacy_statement") or "No privacy statement recorded.")}</p>',
    ]
    if audit and "unreadable" in audit:  # see read_audit
        parts += [f'<h2>Privacy audit</h2><p class="missing">{_e(audit["unreadable"])}</p>']
    elif audit:
        parts += [f"<h2>Privacy audit</h2><p>{_e(audit.get('design', ''))}</p>", _table(audit_rows(audit))]
    if notes:
        parts += ["<h2>Notes</h2><ul>", *(f"<li>{_e(n)}</li>" for n in notes), "</ul>"]
    if plots:
        captions = {**CAPTIONS, **epsilon_captions(summary)}
        parts += ["<h2>Figures</h2>", *(_figure(name, entry, captions) for name, entry in plots.items())]
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _classes(eval_result: dict | None) -> int | None:
    classes = (eval_result or {}).get("num_classes")
    return classes if type(classes) is int else None


def write_report(run_dir: Path, eval_result: dict | None, plots: dict[str, Path], *, title: str | None = None) -> Path:
    """Write ``run_dir/report.html`` from ``summary.json``, ``eval_result`` and the plot PNGs.

    ``plots`` maps a name to a PNG (or to ``(png, caption)``); known names (``epsilon_per_client``,
    ``epsilon_vs_fid``, ``training_curves``, ``bytes_per_step``, ``samples``, ``side_by_side``) get
    a standard caption. When no plot name starts with "samples", the run's latest sample grid is
    added. A missing or unreadable PNG is noted on the page instead of failing the report.
    """
    run_dir = Path(run_dir)
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        raise FileNotFoundError(
            f"{summary_path} does not exist: report.html is written for a finished "
            "run (its summary.json is written at the end)"
        )
    summary = read_json(summary_path)
    if not isinstance(summary, dict):
        raise ValueError(f"{summary_path} is corrupt: it holds a {type(summary).__name__}, not an object")
    plots = dict(plots or {})
    latest = _latest_samples(run_dir)
    if latest is not None and not any(name.startswith("samples") for name in plots):
        step = latest.stem.removeprefix("step-").lstrip("0") or "0"
        plots["samples"] = (latest, f"Samples of the released (EMA) generator at step {step}, one row per class.")
    if title is None:
        title = f"fedgan run: {summary.get('strategy', '?')} on {summary.get('dataset', '?')} ({run_dir.name})"
    audit = read_audit(run_dir / "audit.json")
    page = render_report(summary, eval_result, plots, title=title, audit=audit)
    path = run_dir / REPORT
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, path)
    return path
