"""`seq2seq export`: a run (or checkpoint) written in one of the formats of `ExportFormat` by its
converter: CTranslate2 (`export.py`), a Hugging Face Marian directory (`hf.py`) or Argos
Translate packages (`argos.py`)."""

from __future__ import annotations

from pathlib import Path

from seq2seq_cli.choices import ExportFormat
from seq2seq_cli.errors import UserError


def export_run(model_path: str | Path, output: Path, format: ExportFormat, quantization: str | None = None,
               force: bool = False) -> list[Path]:
    """Write the run at `output` in `format` -> the paths written: the model directory or the
    package, or each package of a run of several language pairs (Argos)."""
    if format is ExportFormat.hf:
        from seq2seq_cli.convert.hf import export_hf

        if quantization is not None:
            raise UserError("--quantization is for --format ctranslate2; hf exports float32 weights")
        return [export_hf(model_path, output, force)]
    if format is ExportFormat.argos:
        from seq2seq_cli.convert.argos import export_argos

        written = export_argos(model_path, output, quantization, force)
        return sorted(written.iterdir()) if written.is_dir() else [written]
    from seq2seq_cli.convert.export import export_ctranslate2

    return [export_ctranslate2(model_path, output, quantization, force)]
