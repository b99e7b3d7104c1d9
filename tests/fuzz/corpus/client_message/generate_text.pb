$Once upon a time*	333?(H0:
