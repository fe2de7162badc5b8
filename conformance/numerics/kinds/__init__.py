"""The error model a stage kind at a time: each kind's float64 value and unit bound."""
