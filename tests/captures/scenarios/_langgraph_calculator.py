"""The LangGraph agent both LangGraph scenarios run: a model node and a ToolNode with `add`, on ChatOpenAI."""

from _capture import MODEL, Ran
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

AGENT = "calculator"  # the compiled graph's name: the agent name the instrumentations report


def run(ran: Ran) -> str:
    """Ask the graph for 2 + 3 and return its answer; `ran` records the tool calls and the agent."""

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return ran.tool("add", {"a": a, "b": b}, a + b)

    model = ChatOpenAI(model=MODEL, temperature=0).bind_tools([add])

    def call_model(state: MessagesState) -> dict:
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", call_model)
    graph.add_node("tools", ToolNode([add]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    ran.agent(AGENT)
    question = HumanMessage("What is 2 + 3? Use the add tool.")
    result = graph.compile(name=AGENT).invoke({"messages": [question]})
    return result["messages"][-1].content
