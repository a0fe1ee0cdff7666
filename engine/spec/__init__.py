"""Speculation from the agents' own text: drafts by n-gram lookup over their histories, chosen per agent for
a decode step, and each agent's measured acceptance."""
