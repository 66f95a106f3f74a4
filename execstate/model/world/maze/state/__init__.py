"""The maze world's state model: a carried pose belief, a learnt motion and a learnt view of one maze."""
