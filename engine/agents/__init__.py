"""The agents and who drives them: an agent and its transitions, the seam to its source, the synthetic swarm,
served conversations (which agent a request continues, its queue), and the prompt a conversation renders to."""
