"""What the REST API and its clients say to each other, below both of them.

``schemas`` holds one pydantic model per body and per response of the REST API,
``batches`` the shapes of its batches. The app declares them and the SDK parses
responses into them, so neither surface imports the other. Pydantic only: a
client imports nothing heavier.
"""
