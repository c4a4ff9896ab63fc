"""Renderers: one per format (terminal via rich, JSON, Markdown). Findings look the same in every command."""
