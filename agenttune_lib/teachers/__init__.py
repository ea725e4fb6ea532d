"""Teachers for distillation: expert gold replays (τ², QA evidence chains), an LLM endpoint, and rejection sampling."""
from agenttune_lib.teachers.base import TeacherInfo, scripted_generation
from agenttune_lib.teachers.llm import EndpointTeacher, RejectionSampling
from agenttune_lib.teachers.no_tool import NoToolTeacher, no_tool_items
from agenttune_lib.teachers.qa import QAExpertTeacher
from agenttune_lib.teachers.tau2 import Tau2ExpertTeacher

__all__ = ["TeacherInfo", "scripted_generation", "Tau2ExpertTeacher", "QAExpertTeacher", "EndpointTeacher", "RejectionSampling", "NoToolTeacher", "no_tool_items"]
