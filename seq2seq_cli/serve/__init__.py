"""The HTTP server of `seq2seq serve`: request batching, the LibreTranslate-compatible API, the web page."""
