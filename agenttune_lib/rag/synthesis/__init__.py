"""The six-stage synthesis pipeline (paper §3.7.2): ``run_pipeline`` and its parts."""
from __future__ import annotations

from agenttune_lib.rag.synthesis.generate import Candidate, ExtractiveGenerator, LLMGenerator, PathContext
from agenttune_lib.rag.synthesis.jsonx import JSONExtractionError, extract_json
from agenttune_lib.rag.synthesis.llm import CallLog, LLMClient, LLMResponse, OpenAICompatLLMClient, TransformersLLMClient
from agenttune_lib.rag.synthesis.pipeline import PipelineResult, SynthesisConfig, SynthesisError, SynthesisPipeline, run_pipeline
from agenttune_lib.rag.synthesis.verify import ExtractiveVerifier, LLMVerifier

__all__ = [
    "Candidate", "CallLog", "ExtractiveGenerator", "ExtractiveVerifier", "JSONExtractionError", "LLMClient", "LLMGenerator", "LLMResponse",
    "LLMVerifier", "OpenAICompatLLMClient", "PathContext", "PipelineResult", "SynthesisConfig", "SynthesisError", "SynthesisPipeline",
    "TransformersLLMClient", "extract_json", "run_pipeline",
]
