from .report import load_run, render_report

__all__ = ["load_run", "render_report"]
