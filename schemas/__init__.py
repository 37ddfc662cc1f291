"""Pydantic models and the Arrow/Parquet schema: the contracts with trainers and between parts.

Pure data: must not import any other project package.
"""
