"""What a conversation is made of, whichever API it came from: a chat message, tool calls and their grammars, the
model's chat template, sampling parameters, the text a client sees, the chunks reused past an edit, and why a
turn missed its cache."""
