"""Telemetry: metrics, metering and the background pollers."""
