"""What a person sees: the Streamlit app over the store and the models."""
