"""Converters between this tool's run directories and other toolkits' model formats."""
