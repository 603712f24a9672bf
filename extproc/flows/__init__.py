"""Request flows: one per kind of request (chat, translation hop, vision, answers from config)."""
