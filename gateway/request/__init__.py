"""The request pipeline: read, analyse, live state, decide, dispatch, settle; api/ and extproc/."""
