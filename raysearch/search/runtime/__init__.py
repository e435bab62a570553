"""The Ray runtime of a search: starting or joining Ray, shipping the model to other nodes, what a
lost node took with it, the start barrier and the score pool."""
