"""Documents: every format translate and serve read and write (plain text, HTML/XML, .docx,
.odt), their detection, sentence splitting and joining, and one translate-a-document function."""
